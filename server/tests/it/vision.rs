//! Image and video input through the HTTP API on the REAL engine loop: a tiny random gemma3
//! (SmolLM2's tokenizer and chat template) with a tiny random Gemma 3 vision tower, on the CPU.
//! Image requests streamed and not (same text), usage counting the image tokens, the same image
//! again served from the prefix cache, video frames, a model without a tower refusing images;
//! 30 corrupt or hostile images and videos each a clean 400 in the OpenAI error shape, the
//! server answering normally afterwards; the official `openai` client
//! (tests/python/test_openai_vision.py).

use std::io::Cursor;
use std::process::Command;
use std::sync::Arc;

use base64::Engine as _;
use memra_engine::backend::Device;
use memra_engine::config::Arch;
use memra_engine::engine::{AdmissionLimits, Engine, EngineConfig, KvBudget};
use memra_engine::formats::gguf::Gguf;
use memra_engine::loader::Model;
use memra_engine::quant::DType;
use memra_engine::tokenizer::Tokenizer;
use memra_engine::vision::random::tiny_tower;
use memra_engine::vision::{ImageTokens, VisionTower};
use memra_server::auth::Auth;
use memra_server::media::{ImageLimits, MediaLimits, Vision};
use memra_server::real::{RealEngine, Visions};
use memra_server::state::{Limits, State};
use serde_json::{Value, json};

use crate::common::{self, tiny_model};

fn limits() -> Limits {
    Limits {
        max_body_bytes: 2 << 20,
        media: MediaLimits {
            image: ImageLimits {
                max_bytes: 256 << 10,
                max_pixels: 1 << 20,
            },
            max_images: 4,
            max_frames: 3,
            video_fps: 1.0,
            allowed_hosts: vec!["127.0.0.1".into()],
        },
        ..Limits::default()
    }
}

/// A server over `models` (alias, model, its tower if any) on the CPU, under [`limits`].
async fn start_with(
    models: Vec<(&str, Model, Option<VisionTower>)>,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let cfg = EngineConfig {
        device: Device::Cpu,
        threads: 2,
        kv: KvBudget::Blocks(256),
        ..EngineConfig::default()
    };
    let mut visions = Visions::new();
    let mut served = Vec::new();
    for (alias, m, tower) in models {
        if let Some(tower) = tower {
            let tokens = ImageTokens::from_tokenizer(&m.tokenizer);
            visions.insert(alias.into(), Arc::new(Vision::new(tower, tokens)));
        }
        served.push((alias.into(), m, cfg.clone()));
    }
    let handle = Engine::start(served, AdmissionLimits::default()).expect("engine");
    let engine = Arc::new(RealEngine::from_handle_with_vision(handle, visions));
    common::serve(Arc::new(State::new(engine, Auth::Open, limits()))).await
}

/// A server with `vlm` (gemma3 + tower) and `text` (llama, no tower).
async fn start() -> (String, tokio::sync::oneshot::Sender<()>) {
    let vlm = tiny_model(Arch::Gemma3);
    let tower = tiny_tower(vlm.config.hidden, 9);
    start_with(vec![
        ("vlm", vlm, Some(tower)),
        ("text", tiny_model(Arch::Llama), None),
    ])
    .await
}

/// A one-shot-per-connection HTTP server on 127.0.0.1 answering every GET with `status`,
/// `content_type` and `body` (the allowed-host fetch, without the network).
async fn image_host(status: &'static str, content_type: &'static str, body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nlocation: http://127.0.0.1:1/\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes()).await;
            let _ = s.write_all(&body).await;
        }
    });
    format!("http://{addr}/cat.png")
}

/// An RGB test image encoded as `fmt`.
pub(crate) fn encoded(w: u32, h: u32, seed: u8, fmt: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x as u8).wrapping_mul(3).wrapping_add(seed),
            (y as u8).wrapping_mul(5),
            ((x ^ y) as u8).wrapping_add(seed.wrapping_mul(7)),
        ])
    });
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, fmt).expect("encode");
    out.into_inner()
}

pub(crate) fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

pub(crate) fn png(seed: u8) -> String {
    data_url("image/png", &encoded(80, 60, seed, image::ImageFormat::Png))
}

fn image_part(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

pub(crate) fn chat(model: &str, parts: Vec<Value>) -> Value {
    json!({"model": model, "max_tokens": 8, "temperature": 0,
           "messages": [{"role": "user", "content": parts}]})
}

pub(crate) fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

pub(crate) async fn post(url: &str, body: &Value) -> (u16, Value, String) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let raw = r.text().await.expect("body");
    let v = serde_json::from_str(&raw).unwrap_or(Value::Null);
    (status, v, raw)
}

/// The text of an SSE chat stream.
pub(crate) fn sse_text(raw: &str) -> String {
    raw.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// A standard CRC-32 (PNG chunks).
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG whose header declares `w x h` (CRC fixed, so only the size is wrong).
fn png_declaring(w: u32, h: u32) -> Vec<u8> {
    let mut b = encoded(8, 8, 1, image::ImageFormat::Png);
    b[16..20].copy_from_slice(&w.to_be_bytes());
    b[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&b[12..29]);
    b[29..33].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A JPEG whose SOF0 declares 65500 x 65500.
fn jpeg_declaring_huge() -> Vec<u8> {
    let mut b = encoded(16, 16, 2, image::ImageFormat::Jpeg);
    let i = b.windows(2).position(|w| w == [0xFF, 0xC0]).expect("SOF0");
    b[i + 5..i + 7].copy_from_slice(&65500u16.to_be_bytes());
    b[i + 7..i + 9].copy_from_slice(&65500u16.to_be_bytes());
    b
}

/// A lossless WebP whose VP8L header declares 16384 x 16384.
fn webp_declaring_huge() -> Vec<u8> {
    let mut b = encoded(16, 16, 3, image::ImageFormat::WebP);
    assert_eq!(&b[12..16], b"VP8L");
    b[21] = 0xFF;
    b[22] = 0xFF;
    b[23] = 0xFF;
    b[24] |= 0x0F;
    b
}

/// A 2000 x 2000 black PNG: a few KB that would decode to 12 MB (over the 1 M pixel limit).
fn png_bomb() -> Vec<u8> {
    let img = image::GrayImage::new(2000, 2000);
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

fn hostile() -> Vec<(&'static str, Value)> {
    let p = encoded(80, 60, 5, image::ImageFormat::Png);
    let j = encoded(80, 60, 5, image::ImageFormat::Jpeg);
    let w = encoded(80, 60, 5, image::ImageFormat::WebP);
    let mut corrupt = p.clone();
    let mid = corrupt.len() / 2;
    for b in &mut corrupt[mid..mid + 16] {
        *b ^= 0x5A;
    }
    let noise: Vec<u8> = (0..400u32 * 400 * 3)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let big = {
        let img = image::RgbImage::from_raw(400, 400, noise).unwrap();
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    };
    assert!(
        big.len() > 256 << 10,
        "the noise PNG is {} bytes",
        big.len()
    );
    let img = |u: String| chat("vlm", vec![text("What is this?"), image_part(&u)]);
    let gif = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;";
    let video = |frames: Vec<String>| {
        chat(
            "vlm",
            vec![
                text("Describe."),
                json!({"type": "video", "video": frames, "fps": 1}),
            ],
        )
    };
    vec![
        (
            "truncated png",
            img(data_url("image/png", &p[..p.len() / 2])),
        ),
        ("png header only", img(data_url("image/png", &p[..30]))),
        (
            "truncated jpeg",
            img(data_url("image/jpeg", &j[..j.len() / 2])),
        ),
        (
            "truncated webp",
            img(data_url("image/webp", &w[..w.len() / 2])),
        ),
        ("corrupt png data", img(data_url("image/png", &corrupt))),
        (
            "png declaring 100000x100000",
            img(data_url("image/png", &png_declaring(100_000, 100_000))),
        ),
        (
            "png declaring 0x0",
            img(data_url("image/png", &png_declaring(0, 0))),
        ),
        (
            "jpeg declaring 65500x65500",
            img(data_url("image/jpeg", &jpeg_declaring_huge())),
        ),
        (
            "webp declaring 16384x16384",
            img(data_url("image/webp", &webp_declaring_huge())),
        ),
        (
            "png bomb (2000x2000 zeros)",
            img(data_url("image/png", &png_bomb())),
        ),
        ("png said to be jpeg", img(data_url("image/jpeg", &p))),
        ("jpeg said to be png", img(data_url("image/png", &j))),
        ("webp said to be png", img(data_url("image/png", &w))),
        ("gif", img(data_url("image/gif", gif))),
        (
            "svg",
            img(data_url(
                "image/svg+xml",
                b"<svg xmlns='http://www.w3.org/2000/svg'/>",
            )),
        ),
        ("text/plain", img(data_url("text/plain", b"hello"))),
        (
            "random bytes as png",
            img(data_url("image/png", &[7u8; 300])),
        ),
        ("empty data", img("data:image/png;base64,".into())),
        (
            "not base64",
            img("data:image/png;base64,!!!not*base64!!!".into()),
        ),
        ("no base64 marker", img("data:image/png,abcd".into())),
        ("no comma", img("data:image/png;base64".into())),
        ("over the byte limit", img(data_url("image/png", &big))),
        ("remote url", img("https://evil.example/x.png".into())),
        (
            "allowed host, no fetching",
            img("http://images.example/x.png".into()),
        ),
        ("file url", img("file:///etc/passwd".into())),
        (
            "video data url",
            img(data_url("video/mp4", b"\x00\x00\x00\x18ftypmp42")),
        ),
        (
            "video_url part",
            chat(
                "vlm",
                vec![
                    json!({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}),
                ],
            ),
        ),
        (
            "too many frames",
            video((0..5).map(|i| png(i as u8)).collect()),
        ),
        (
            "corrupt frame",
            video(vec![png(1), data_url("image/png", &p[..40])]),
        ),
        (
            "too many images",
            chat("vlm", (0..5).map(|i| image_part(&png(i as u8))).collect()),
        ),
        (
            "image part without url",
            chat(
                "vlm",
                vec![json!({"type": "image_url", "image_url": {"detail": "high"}})],
            ),
        ),
        (
            "unknown part type",
            chat(
                "vlm",
                vec![json!({"type": "input_audio", "input_audio": {"data": "AAAA"}})],
            ),
        ),
        (
            "object replacement character in the text",
            chat("vlm", vec![text("look \u{FFFC} here"), image_part(&png(1))]),
        ),
        (
            "image for a model without a tower",
            chat("text", vec![text("hi"), image_part(&png(1))]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_and_videos_through_the_api() {
    let (url, _stop) = start().await;
    // An image request, not streamed and streamed: the same text.
    let body = chat(
        "vlm",
        vec![text("Describe this image."), image_part(&png(1))],
    );
    let (s, v, raw) = post(&url, &body).await;
    assert_eq!(s, 200, "{raw}");
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (s, _, raw) = post(&url, &sb).await;
    assert_eq!(s, 200);
    assert_eq!(sse_text(&raw), answer);
    // The 16 image rows are prompt tokens; the text alone has fewer.
    let (_, tv, _) = post(&url, &chat("vlm", vec![text("Describe this image.")])).await;
    assert_eq!(
        tv["usage"]["prompt_tokens"].as_u64().unwrap() + 16,
        prompt_tokens
    );
    // The same image again: a prefix-cache hit past the image; another image: other output.
    let (_, again, _) = post(&url, &body).await;
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached > 16, "{again}");
    assert_eq!(again["choices"][0]["message"]["content"], answer.as_str());
    let other = chat(
        "vlm",
        vec![text("Describe this image."), image_part(&png(99))],
    );
    let (_, o, _) = post(&url, &other).await;
    let ocached = o["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(ocached < cached, "{o}");
    // JPEG and WebP decode too.
    for (mime, fmt) in [
        ("image/jpeg", image::ImageFormat::Jpeg),
        ("image/webp", image::ImageFormat::WebP),
    ] {
        let u = data_url(mime, &encoded(50, 70, 4, fmt));
        let (s, _, raw) = post(&url, &chat("vlm", vec![image_part(&u), text("And this?")])).await;
        assert_eq!(s, 200, "{mime}: {raw}");
    }
    // A video of 6 frames at 2 fps, sampled at 1 fps: 3 frames of 16 rows.
    let frames: Vec<String> = (0..6).map(|i| png(10 + i as u8)).collect();
    let vb = chat(
        "vlm",
        vec![
            text("What happens?"),
            json!({"type": "video", "video": frames, "fps": 2}),
        ],
    );
    let (s, vv, raw) = post(&url, &vb).await;
    assert_eq!(s, 200, "{raw}");
    let (_, t2, _) = post(&url, &chat("vlm", vec![text("What happens?")])).await;
    assert_eq!(
        vv["usage"]["prompt_tokens"].as_u64().unwrap(),
        t2["usage"]["prompt_tokens"].as_u64().unwrap() + 3 * 16
    );

    // An allowed host's image (plain http, a local server): the same pixels as the data: URL,
    // so the same answer (and a prefix hit: the hash is of the pixels).
    let png1 = encoded(80, 60, 1, image::ImageFormat::Png);
    let host = image_host("200 OK", "image/png", png1).await;
    let fb = chat("vlm", vec![text("Describe this image."), image_part(&host)]);
    let (s, fv, raw) = post(&url, &fb).await;
    assert_eq!(s, 200, "{raw}");
    assert_eq!(fv["choices"][0]["message"]["content"], answer.as_str());
    assert!(
        fv["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 16
    );
    for (status, ct) in [("302 Found", "image/png"), ("200 OK", "text/html")] {
        let host = image_host(status, ct, encoded(8, 8, 1, image::ImageFormat::Png)).await;
        let (s, _, raw) = post(&url, &chat("vlm", vec![image_part(&host)])).await;
        assert_eq!(s, 400, "{status} {ct}: {raw}");
    }

    // 30+ hostile inputs: each a 400 in the OpenAI error shape.
    let cases = hostile();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    for (what, body) in &cases {
        let (s, v, raw) = post(&url, body).await;
        assert_eq!(s, 400, "{what}: {raw}");
        let e = &v["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {raw}"
        );
        assert_eq!(e["type"], "invalid_request_error", "{what}: {raw}");
    }
    // The server still answers, with the same bits as before.
    let (s, v, _) = post(&url, &body).await;
    assert_eq!(s, 200);
    assert_eq!(v["choices"][0]["message"]["content"], answer.as_str());

    // The official openai client, streamed and not, images and a video.
    openai_vision(&url, "vlm", &[], "").await;
}

/// Runs the official `openai` client's tests (tests/python/test_openai_vision.py, with
/// `args`) against `alias` at `url`; a failure shows its output after `what`.
pub(crate) async fn openai_vision(url: &str, alias: &str, args: &[&str], what: &str) {
    let script = format!(
        "{}/tests/python/test_openai_vision.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let python = memra_engine::settings::var("MEMRA_PYTHON").unwrap_or_else(|| "python3".into());
    let (u, a) = (url.to_string(), alias.to_string());
    let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(&script)
            .args(&argv)
            .env("MEMRA_TEST_URL", &u)
            .env("MEMRA_TEST_KEY", "none")
            .env("MEMRA_TEST_ALIAS", &a)
            .output()
            .expect("python3 (MEMRA_PYTHON) with `openai` (tools/test.sh installs it)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{what}test_openai_vision.py{} failed:\n{}\n{}",
        args.iter().map(|a| format!(" {a}")).collect::<String>(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn models_entry_takes_an_mmproj() {
    let m =
        memra_server::config::parse_models("v=/m/g.gguf+mmproj=/m/mmproj.gguf+kv=q8_0").unwrap();
    assert_eq!(
        m[0].mmproj.as_deref(),
        Some(std::path::Path::new("/m/mmproj.gguf"))
    );
    assert!(memra_server::config::parse_models("v=/m/g.gguf+mmproj=").is_err());
    // A tower whose width does not match the model is refused at load, naming both.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mm.gguf");
    let p = memra_engine::vision::TowerParams::tiny(32);
    let w = memra_engine::vision::random::random_tower(&p, 1);
    memra_engine::vision::random::write_mmproj(&p, &w, DType::F32, &path).unwrap();
    let tok =
        Tokenizer::from_gguf(&Gguf::open(&memra_engine::testing::real_model()).unwrap()).unwrap();
    let e = memra_server::real::load_vision("v", &path, &tok, 64, Device::Cpu)
        .err()
        .unwrap();
    assert!(e.contains("32") && e.contains("64"), "{e}");
    assert!(memra_server::real::load_vision("v", &path, &tok, 32, Device::Cpu).is_ok());
    assert!(
        memra_server::real::load_vision("v", &dir.path().join("none"), &tok, 32, Device::Cpu)
            .is_err()
    );
}

/// A server with `qvl`: a tiny random text model of `arch` and a tiny random Qwen ViT of
/// `kind` (4-pixel patches merged 2 x 2: 8 pixels a token, 4..64 tokens an image; Qwen2.5-VL:
/// windows of 2 x 2 tokens; Qwen3-VL: a deepstack merger).
pub(crate) async fn start_qwen(
    arch: Arch,
    kind: memra_engine::vision::QwenKind,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let m = tiny_model(arch);
    let tower = memra_engine::vision::random::tiny_qwen(kind, m.config.hidden, 4).unwrap();
    assert_eq!(tower.out_width(), m.config.embed_width());
    start_with(vec![("qvl", m, Some(tower))]).await
}

/// The Qwen ViT through the API, with the Qwen-VL text models (qwen2vl with Qwen2.5-VL's
/// tower, qwen3vl with Qwen3-VL's and its deepstack rows): images of any aspect ratio become
/// their smart-resized token counts (80 x 60 -> 72 x 48: 9 x 6 = 54 tokens; 120 x 30 -> 120 x
/// 32: 15 x 4 = 60), placed by M-RoPE on their grids, streamed == not streamed, the same image
/// again a prefix-cache hit past it, an image beyond 200:1 a clean 400 naming the part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_tower_through_the_api() {
    use memra_engine::vision::QwenKind;
    for (arch, kind) in [
        (Arch::Qwen2Vl, QwenKind::Qwen25Vl),
        (Arch::Qwen3Vl, QwenKind::Qwen3Vl),
    ] {
        qwen_api(arch, kind).await;
    }
}

async fn qwen_api(arch: Arch, kind: memra_engine::vision::QwenKind) {
    let (url, _stop) = start_qwen(arch, kind).await;
    let (_, tv, _) = post(&url, &chat("qvl", vec![text("Describe this image.")])).await;
    let text_tokens = tv["usage"]["prompt_tokens"].as_u64().unwrap();
    let wide = data_url("image/png", &encoded(120, 30, 2, image::ImageFormat::Png));
    for (img, rows) in [(png(1), 54), (wide, 60)] {
        let body = chat("qvl", vec![text("Describe this image."), image_part(&img)]);
        let (s, v, raw) = post(&url, &body).await;
        assert_eq!(s, 200, "{raw}");
        assert_eq!(
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            text_tokens + rows
        );
        let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (_, _, raw) = post(&url, &sb).await;
        assert_eq!(sse_text(&raw), answer);
        let (_, again, _) = post(&url, &body).await;
        let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached > rows, "{again}");
        assert_eq!(again["choices"][0]["message"]["content"], answer);
    }
    let thin = data_url("image/png", &encoded(402, 2, 3, image::ImageFormat::Png));
    let (s, v, raw) = post(&url, &chat("qvl", vec![image_part(&thin)])).await;
    assert_eq!(s, 400, "{raw}");
    assert!(raw.contains("200:1"), "{raw}");
    assert!(
        v["error"]["param"].as_str().unwrap().contains("messages"),
        "{v}"
    );
    // The server still answers.
    let (s, _, raw) = post(&url, &chat("qvl", vec![image_part(&png(3))])).await;
    assert_eq!(s, 200, "{raw}");
}

/// A Qwen tower loads beside a text model of its width; one with deepstack mergers (Qwen3-VL)
/// beside a model of the main rows' width only (not a qwen3vl with as many deepstack layers) is
/// refused at load, naming them; beside one of its rows' width it loads.
#[test]
fn qwen_mmproj_loads_and_deepstack_is_refused() {
    use memra_engine::vision::random::{random_qwen, write_qwen_mmproj};
    use memra_engine::vision::{QwenKind, QwenParams};
    let dir = tempfile::tempdir().unwrap();
    let tok =
        Tokenizer::from_gguf(&Gguf::open(&memra_engine::testing::real_model()).unwrap()).unwrap();
    for kind in [QwenKind::Qwen2Vl, QwenKind::Qwen25Vl, QwenKind::Qwen3Vl] {
        let mut p = QwenParams::tiny(kind, 64);
        let path = dir.path().join(format!("{kind:?}.gguf"));
        write_qwen_mmproj(&p, &random_qwen(&p, 1).unwrap(), DType::F32, &path).unwrap();
        let r = memra_server::real::load_vision("v", &path, &tok, 64, Device::Cpu);
        if kind == QwenKind::Qwen3Vl {
            let e = r.err().unwrap();
            assert!(e.contains("deepstack") && e.contains("qwen3vl"), "{e}");
            let v = memra_server::real::load_vision("v", &path, &tok, 128, Device::Cpu).unwrap();
            assert_eq!(v.tower.out_width(), 128);
            p.deepstack.clear();
            write_qwen_mmproj(&p, &random_qwen(&p, 1).unwrap(), DType::F32, &path).unwrap();
            let v = memra_server::real::load_vision("v", &path, &tok, 64, Device::Cpu).unwrap();
            assert_eq!(v.tower.out_width(), 64);
        } else {
            let v = r.unwrap();
            assert_eq!(v.tower.tokens_for(64, 32), 32);
        }
    }
}
