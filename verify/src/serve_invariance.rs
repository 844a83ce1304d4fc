//! `serve-invariance`: the same prompts through the engine alone, then together with staggered
//! arrivals and mixed lengths (chunked prefill, a KV pool small enough to preempt), then again
//! with the prefix cache warm, then together on an engine that speculates as memra-server does
//! by default (`SpecConfig::auto()`: the model's MTP layers if it has them, with n-gram lookup;
//! at most 16 running drafting), then on one that drafts for every running sequence (`auto`, K
//! = 8, no load cut-off); one request in three opts out of speculation. Every token, text byte
//! and logprob bit must be identical. Half the requests are sampled (temperature 0.8, top-p
//! 0.95, top-k 40, a repetition penalty, a seed per request); one in four is constrained by a
//! JSON schema (structured output), so grammar masks run in the mixed load too. With a vision
//! tower (`--mmproj`), one request in three carries an image (two images, each in several
//! requests; encoded once by the tower on the gate's device, a CUDA device's CUDA tower), placed
//! before the request's text: image rows under the same staggered load, preemption, prefix
//! hits (of the image's blocks too) and speculation, with the same bytes as alone.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memra_engine::backend::Device;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, EngineHandle, KvBudget};
use memra_engine::grammar::{Grammar, GrammarSpec, Grammars};
use memra_engine::loader::{Model, load_model};
use memra_engine::request::{Event, EventStream, SubmitError, ValidRequest};
use memra_engine::sampling::SamplingParams;
use memra_engine::scheduler::SchedulerConfig;
use memra_engine::spec::SpecConfig;
use memra_engine::tokenizer::Tokenizer;
use memra_engine::vision::{ImageTokens, MediaSpan, VisionTower};
use memra_engine::{Error, Result};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub device: Device,
    pub requests: usize,
    pub max_tokens: usize,
    pub kv_dtype: memra_engine::backend::KvDtype,
    /// Tokens of a long shared context put before the shared prompts (0: none): long prompts
    /// (chunked prefill over thousands of positions) and a prefix-cache hit of that many tokens
    /// in the warm phase (issue 11: a cached long conversation gives the cold run's bytes).
    pub context: usize,
    /// Pipeline stages the engine serves the model on (default: unsplit).
    pub pp: memra_engine::pipeline::PpConfig,
    /// A vision tower the model takes rows of (an mmproj GGUF): one request in three carries
    /// an image.
    pub mmproj: Option<PathBuf>,
}

/// One request's output: tokens, text, logprob bits (own and top alternatives), finish reason.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub text: String,
    pub logprobs: Vec<(u32, Vec<(u32, u32)>)>,
    pub finish: String,
    pub cached_tokens: usize,
    /// Draft tokens accepted (usage).
    pub accepted: usize,
}

/// The comparison.
#[derive(Debug, Default)]
pub struct Report {
    pub backend: String,
    pub requests: usize,
    /// Requests constrained by a JSON schema.
    pub constrained: usize,
    pub tokens_compared: usize,
    /// Prompt tokens served from the prefix cache in the warm phase.
    pub warm_cached_tokens: usize,
    pub preemptions: u64,
    /// Draft tokens checked / accepted in the speculative phases (default, then every sequence).
    pub spec_drafted: u64,
    pub spec_accepted: u64,
    /// The drafter of the speculative phases (`ngram`, `mtp+ngram`).
    pub drafter: String,
    /// Draft tokens accepted from sampled requests (speculative phases).
    pub sampled_accepted: usize,
    /// Requests with an image, and where the tower encoded them (`cpu`, `cuda:0 (...)`).
    pub image_requests: usize,
    /// Prompt tokens of the requests with an image served from the prefix cache when warm.
    pub image_cached_tokens: usize,
    pub tower: String,
    pub failures: Vec<String>,
}

const SHARED: &str = "You are a careful assistant. Answer briefly and precisely, using plain \
words. Think about what the user needs, state only facts you are sure of, and keep the answer \
short. The user writes:";

const QUESTIONS: &[&str] = &[
    "What is the capital of France?",
    "Name three colors.",
    "Write a haiku about the sea and the wind at night, please.",
    "Why is the sky blue?",
    "Count from one to ten.",
    "What do bees make?",
    "Give me a short list of fruits that are red, and explain which one you like best and why.",
    "Hi",
];

const FILLER: &str = "Earlier in this conversation the user and the assistant talked about \
rivers, mountains, old maps, the weather of coastal towns, and how to bake bread at home. ";

/// `n` tokens of a fixed filler text (repeated as often as needed).
fn context_tokens(tok: &Tokenizer, n: usize) -> Result<Vec<u32>> {
    let unit = tok.encode(FILLER, false)?;
    if unit.is_empty() {
        return Err(Error::Input(
            "the tokenizer encodes the filler text to nothing".into(),
        ));
    }
    Ok(unit.iter().copied().cycle().take(n).collect())
}

/// A prompt's ids and its image, if any.
struct Prompt {
    ids: Vec<u32>,
    media: Vec<MediaSpan>,
}

/// The images of the image requests, encoded once by the tower on the gate's device: each
/// one's span (its rows, the part the model takes; hash; token grid) at position 0.
struct Images {
    spans: Vec<MediaSpan>,
    tokens: ImageTokens,
    /// Where the tower ran.
    tower: String,
}

/// Two images (the vision gate's first two: for the Qwen ViT a square and a wide one) through
/// the tower of `mmproj` on `device`.
fn images(mmproj: &Path, m: &Model, device: Device) -> Result<Images> {
    let mut tower = VisionTower::open(mmproj)?;
    let take = crate::vision_qwen::rows_taken(&tower, &m.config)?;
    tower.place(device)?;
    let width = tower.out_width();
    let spans = crate::vision_qwen::images(&tower, 2)?
        .iter()
        .map(|i| {
            let r = tower.encode_image(i.w, i.h, &i.rgb)?;
            Ok(MediaSpan {
                start: 0,
                embeds: Arc::from(crate::vision_qwen::main_rows(&r, width, take)),
                width: take,
                hash: tower.hash_image(i.w, i.h, &i.rgb),
                grid: Some(tower.grid_for(i.w, i.h)),
                times: Vec::new(),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Images {
        spans,
        tokens: ImageTokens::from_tokenizer(&m.tokenizer),
        tower: tower.runs_on(),
    })
}

/// Which image request `i` carries (with a tower; modulo the images' count): one request in
/// three, from the first, the images in turn, so each image is in several requests.
fn with_image(i: usize) -> Option<usize> {
    i.is_multiple_of(3).then_some(i / 3)
}

/// Prompts of mixed lengths; most share a long common prefix (`context` filler tokens, then
/// the shared instructions), one in four is short. With `images`, one in three has an image
/// before its text (after the context): those with the same image share it in their prefix.
fn prompts(
    tok: &Tokenizer,
    n: usize,
    context: usize,
    images: Option<&Images>,
) -> Result<Vec<Prompt>> {
    let bos = tok.add_bos_default();
    let ctx = context_tokens(tok, context)?;
    (0..n)
        .map(|i| {
            let q = QUESTIONS[i % QUESTIONS.len()];
            let short = i % 4 == 3;
            let image = images.zip(with_image(i));
            if short && image.is_none() {
                let ids = tok.encode(&format!("{q} ({i})"), bos)?;
                return Ok(Prompt { ids, media: vec![] });
            }
            let mut ids = tok.encode("", bos)?;
            if !short {
                ids.extend_from_slice(&ctx);
            }
            let mut media = Vec::new();
            if let Some((im, k)) = image {
                let span = &im.spans[k % im.spans.len()];
                let (toks, first) = im.tokens.expand(span.rows());
                media.push(MediaSpan {
                    start: ids.len() + first,
                    ..span.clone()
                });
                ids.extend(toks);
            }
            let text = match short {
                true => format!("{q} ({i})"),
                false => format!("{SHARED} {q} ({i})"),
            };
            ids.extend(tok.encode(&text, false)?);
            Ok(Prompt { ids, media })
        })
        .collect()
}

fn params(i: usize) -> SamplingParams {
    if i.is_multiple_of(2) {
        SamplingParams::default()
    } else {
        SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            top_k: 40,
            repetition_penalty: 1.1,
            seed: 7 + i as u64,
            ..Default::default()
        }
    }
}

/// Whether request `i` may speculate in the speculative phase (one in three opts out).
fn speculates(i: usize) -> bool {
    i % 3 != 2
}

/// Whether request `i` is constrained by the JSON schema.
fn constrained(i: usize) -> bool {
    i % 4 == 1
}

/// The schema of the constrained requests: nested objects, an enum, an array, required fields.
fn schema_grammar(tok: &Tokenizer) -> Result<Arc<Grammar>> {
    let schema = serde_json::json!({"type": "object", "properties": {
        "answer": {"type": "string", "maxLength": 40},
        "confidence": {"enum": ["low", "medium", "high"]},
        "facts": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
        "source": {"type": "object", "properties": {"kind": {"enum": ["memory", "guess"]}},
            "required": ["kind"], "additionalProperties": false}},
        "required": ["answer", "confidence", "facts", "source"], "additionalProperties": false});
    Grammars::new(tok).compile(&GrammarSpec::JsonSchema(schema))
}

fn request(prompt: &Prompt, i: usize, max_tokens: usize, g: &Arc<Grammar>) -> ValidRequest {
    ValidRequest {
        tenant: "verify".into(),
        media: prompt.media.clone(),
        params: params(i),
        logprobs: Some(2),
        ignore_eos: false,
        speculative: speculates(i),
        grammar: constrained(i).then(|| g.clone()),
        ..memra_engine::testing::text_request(prompt.ids.clone(), max_tokens)
    }
}

fn submit(e: &EngineHandle, r: ValidRequest) -> Result<EventStream> {
    e.submit(r)
        .map_err(|e: SubmitError| Error::Input(format!("submit: {e}")))
}

/// Reads one event into `o`; `false` after the last.
fn read(s: &mut EventStream, o: &mut Output) -> Result<bool> {
    match s.blocking_recv() {
        Some(Event::Token(t)) => {
            o.tokens.push(t.id);
            o.text.push_str(&t.text);
            let top = t
                .top_logprobs
                .iter()
                .map(|(i, l)| (*i, l.to_bits()))
                .collect();
            o.logprobs.push((t.logprob.map_or(0, f32::to_bits), top));
            Ok(true)
        }
        Some(Event::Text(s)) => {
            o.text.push_str(&s);
            Ok(true)
        }
        Some(Event::Done {
            finish_reason,
            usage,
        }) => {
            o.finish = finish_reason.as_str().to_string();
            o.cached_tokens = usage.cached_tokens;
            o.accepted = usage.accepted_tokens;
            Ok(false)
        }
        Some(Event::Error(e)) => Err(Error::Input(format!("request failed: {e}"))),
        None => Err(Error::Input("stream ended without Done".into())),
    }
}

fn drain(mut s: EventStream, mut o: Output) -> Result<Output> {
    while read(&mut s, &mut o)? {}
    Ok(o)
}

/// All prompts submitted with staggered arrivals: the first half at once, the rest one by one
/// after the first request has produced each further token.
fn together(
    e: &EngineHandle,
    p: &[Prompt],
    max_tokens: usize,
    g: &Arc<Grammar>,
) -> Result<Vec<Output>> {
    let half = p.len().div_ceil(2);
    let mut streams = Vec::new();
    for (i, q) in p.iter().enumerate().take(half) {
        streams.push(submit(e, request(q, i, max_tokens, g))?);
    }
    let mut first = Output::default();
    let mut first_open = true;
    for (i, q) in p.iter().enumerate().skip(half) {
        if first_open && let Some(s) = streams.first_mut() {
            first_open = read(s, &mut first)?;
        }
        streams.push(submit(e, request(q, i, max_tokens, g))?);
    }
    let mut out = Vec::new();
    for (i, s) in streams.into_iter().enumerate() {
        let o = if i == 0 {
            if first_open {
                drain(s, std::mem::take(&mut first))?
            } else {
                std::mem::take(&mut first)
            }
        } else {
            drain(s, Output::default())?
        };
        out.push(o);
    }
    Ok(out)
}

fn compare(phase: &str, base: &[Output], got: &[Output], rep: &mut Report) {
    for (i, (a, b)) in base.iter().zip(got).enumerate() {
        rep.tokens_compared += b.tokens.len();
        let what = if a.tokens != b.tokens {
            "tokens"
        } else if a.text != b.text {
            "text"
        } else if a.logprobs != b.logprobs {
            "logprobs"
        } else if a.finish != b.finish {
            "finish reason"
        } else {
            continue;
        };
        let at = a
            .tokens
            .iter()
            .zip(&b.tokens)
            .position(|(x, y)| x != y)
            .unwrap_or(a.tokens.len().min(b.tokens.len()));
        rep.failures.push(format!(
            "{phase}: request {i}: {what} differ (first token difference at {at})"
        ));
    }
}

/// Runs the three phases on `model`.
pub fn run(model: &Path, opts: &Options) -> Result<Report> {
    if opts.requests == 0 || opts.max_tokens == 0 {
        return Err(Error::Input(
            "--requests and --max-tokens must be > 0".into(),
        ));
    }
    let m = load_model(model)?;
    let tok = m.tokenizer.clone();
    let im = match &opts.mmproj {
        Some(f) => Some(images(f, &m, opts.device)?),
        None => None,
    };
    let p = prompts(&tok, opts.requests, opts.context, im.as_ref())?;
    let g = schema_grammar(&tok)?;
    let bs = 16;
    let per: Vec<usize> = p
        .iter()
        .map(|q| (q.ids.len() + opts.max_tokens).div_ceil(bs))
        .collect();
    // An image's rows are computed in one step: the budget holds the largest and a few rows.
    let image_rows = p.iter().flat_map(|q| &q.media).map(|s| s.rows()).max();
    let largest = per.iter().copied().max().unwrap_or(1);
    // Room for about half the requests at once: the together phases preempt.
    let blocks = (per.iter().sum::<usize>() / 2).max(largest + 2);
    let base = EngineConfig {
        device: opts.device,
        threads: 0,
        block_size: bs,
        kv: KvBudget::Blocks(blocks),
        kv_dtype: opts.kv_dtype,
        scheduler: SchedulerConfig {
            max_batch_tokens: image_rows.map_or(48, |r| 48.max(r + 4)),
            max_running: 64,
            max_running_per_tenant: 64,
            admit_reserve_blocks: 1,
            recurrent: false,
            state_snapshots: None,
        },
        prefix_cache: true,
        spec: None,
        pp: opts.pp.clone(),
    };
    let limits = AdmissionLimits {
        max_in_flight_per_tenant: 1024 + 64,
        max_queued: 1024,
    };
    let e = Engine::start(vec![("m".into(), m, base.clone())], limits.clone())?;
    let mut rep = Report {
        backend: e
            .models()
            .first()
            .map(|m| m.backend.clone())
            .unwrap_or_default(),
        requests: p.len(),
        constrained: (0..p.len()).filter(|&i| constrained(i)).count(),
        image_requests: p.iter().filter(|q| !q.media.is_empty()).count(),
        tower: im.map(|i| i.tower).unwrap_or_default(),
        ..Default::default()
    };
    let mut alone = Vec::new();
    for (i, q) in p.iter().enumerate() {
        alone.push(drain(
            submit(&e, request(q, i, opts.max_tokens, &g))?,
            Output::default(),
        )?);
    }
    let cold = together(&e, &p, opts.max_tokens, &g)?;
    compare("together", &alone, &cold, &mut rep);
    let warm = together(&e, &p, opts.max_tokens, &g)?;
    compare("warm", &alone, &warm, &mut rep);
    rep.warm_cached_tokens = warm.iter().map(|o| o.cached_tokens).sum();
    rep.image_cached_tokens = p
        .iter()
        .zip(&warm)
        .filter(|(q, _)| !q.media.is_empty())
        .map(|(_, o)| o.cached_tokens)
        .sum();
    rep.preemptions = e.stats().models.iter().map(|m| m.preemptions_total).sum();
    if rep.warm_cached_tokens == 0 && p.len() > 1 {
        rep.failures
            .push("warm: no prompt token came from the prefix cache".into());
    }
    e.shutdown();
    // The same load on an engine that speculates as memra-server does by default, then on one
    // that drafts for every running sequence, deeper.
    let every = SpecConfig {
        k: 8,
        max_batch: usize::MAX,
        ..SpecConfig::auto()
    };
    for (phase, spec) in [("default", SpecConfig::auto()), ("speculative", every)] {
        let cfg = EngineConfig {
            spec: Some(spec),
            ..base.clone()
        };
        let e = Engine::start(vec![("m".into(), load_model(model)?, cfg)], limits.clone())?;
        let spec_out = together(&e, &p, opts.max_tokens, &g)?;
        compare(phase, &alone, &spec_out, &mut rep);
        rep.sampled_accepted += spec_out
            .iter()
            .enumerate()
            .filter(|(i, _)| params(*i).temperature > 0.0)
            .map(|(_, o)| o.accepted)
            .sum::<usize>();
        for m in e.stats().models {
            rep.spec_drafted += m.spec_drafted_total;
            rep.spec_accepted += m.spec_accepted_total;
            rep.drafter = m.spec_drafter;
        }
        e.shutdown();
    }
    Ok(rep)
}

/// The summary printed by the subcommand.
pub fn summary(r: &Report) -> String {
    let images = match r.image_requests {
        0 => String::new(),
        n => format!(
            ", {n} with an image from the tower on {}: {} of their prompt tokens from the cache \
             when warm",
            r.tower, r.image_cached_tokens
        ),
    };
    let mut s = format!(
        "serve-invariance on {}: {} requests ({} constrained by a JSON schema{images}) alone / together \
         (staggered) / warm prefix cache / default speculation / speculative for all; {} tokens compared, {} prompt tokens from the cache when warm, {} preemptions, \
         drafter {}: {} drafts ({} accepted, {} of them in sampled requests), {} differences\n",
        r.backend,
        r.requests,
        r.constrained,
        r.tokens_compared,
        r.warm_cached_tokens,
        r.preemptions,
        r.drafter,
        r.spec_drafted,
        r.spec_accepted,
        r.sampled_accepted,
        r.failures.len()
    );
    for f in &r.failures {
        s.push_str(&format!("FAIL {f}\n"));
    }
    s
}
