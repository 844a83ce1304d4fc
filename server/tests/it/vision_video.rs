//! Video through the HTTP API on a Qwen ViT (the model's own video path, media/video.rs): a
//! tiny random qwen2vl with Qwen2-VL's and with Qwen2.5-VL's tower (one span of frame groups
//! placed in time) and a qwen3vl with Qwen3-VL's (a span per group after its timestamp text),
//! on the CPU. Three frames (two groups, the last repeated) of 54 tokens a group: a 200, the
//! same output streamed and again (a prefix-cache hit past the video); the same frames at
//! another rate a miss from the video on (Qwen2.5-VL: other times; Qwen3-VL: other
//! timestamps); Qwen2.5-VL times that would run ahead of tiny frames a clean 400; the official
//! `openai` client's video test.

use memra_engine::config::Arch;
use memra_engine::vision::QwenKind;
use serde_json::{Value, json};

use super::vision::{
    chat, data_url, encoded, openai_vision, png, post, sse_text, start_qwen, text,
};

fn video(frames: Vec<String>, fps: f64) -> Value {
    json!({"type": "video", "video": frames, "fps": fps})
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_video_through_the_api() {
    for (arch, kind) in [
        (Arch::Qwen2Vl, QwenKind::Qwen2Vl),
        (Arch::Qwen2Vl, QwenKind::Qwen25Vl),
        (Arch::Qwen3Vl, QwenKind::Qwen3Vl),
    ] {
        qwen_video(arch, kind).await;
    }
}

async fn qwen_video(arch: Arch, kind: QwenKind) {
    let (url, _stop) = start_qwen(arch, kind).await;
    let (_, tv, _) = post(&url, &chat("qvl", vec![text("What happens?")])).await;
    let text_tokens = tv["usage"]["prompt_tokens"].as_u64().unwrap();
    // 80 x 60 frames: 72 x 48, 9 x 6 = 54 tokens a group; 3 frames at 1 fps: 2 groups.
    let frames: Vec<String> = (0..3).map(|i| png(30 + i)).collect();
    let body = chat(
        "qvl",
        vec![text("What happens?"), video(frames.clone(), 1.0)],
    );
    let (s, v, raw) = post(&url, &body).await;
    assert_eq!(s, 200, "{kind:?}: {raw}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    match kind {
        // One span: its 108 rows (SmolLM2's vocabulary has no <|vision_start|>).
        QwenKind::Qwen2Vl | QwenKind::Qwen25Vl => assert_eq!(prompt, text_tokens + 108),
        // A span per group, each after its timestamp text.
        QwenKind::Qwen3Vl => assert!(prompt > text_tokens + 108 + 4, "{prompt}"),
    }
    let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, _, raw) = post(&url, &sb).await;
    assert_eq!(sse_text(&raw), answer, "{kind:?}");
    // The same frames at the same rate: the same output, a hit past the video.
    let (_, again, _) = post(&url, &body).await;
    assert_eq!(
        again["choices"][0]["message"]["content"], answer,
        "{kind:?}"
    );
    assert!(cached(&again) > 108, "{kind:?}: {again}");
    // The same frames at another rate (both under --media-video-fps: every frame kept).
    let slow = chat("qvl", vec![text("What happens?"), video(frames, 0.5)]);
    let (s, o, raw) = post(&url, &slow).await;
    assert_eq!(s, 200, "{kind:?}: {raw}");
    match kind {
        // Qwen2-VL's times are group indices whatever the rate: the same KV, a hit.
        QwenKind::Qwen2Vl => assert!(cached(&o) > 108, "{o}"),
        // Other times (Qwen2.5-VL) or timestamps (Qwen3-VL): a miss from the video on.
        _ => assert!(cached(&o) < text_tokens, "{kind:?}: {o}"),
    }
    if kind == QwenKind::Qwen25Vl {
        // 8 x 8 frames: 16 x 16, 2 x 2 = 4 tokens a group; at 0.25 fps a group is 8 s, 16
        // positions: past its 4 tokens, refused naming the part.
        let tiny: Vec<String> = (0..3)
            .map(|i| data_url("image/png", &encoded(8, 8, i, image::ImageFormat::Png)))
            .collect();
        let (s, e, raw) = post(&url, &chat("qvl", vec![video(tiny, 0.25)])).await;
        assert_eq!(s, 400, "{raw}");
        assert!(raw.contains("frame group"), "{raw}");
        assert!(
            e["error"]["param"].as_str().unwrap().contains("video"),
            "{e}"
        );
    }
    // The official openai client's video test, streamed and not.
    openai_vision(&url, "qvl", &["video"], &format!("{kind:?}: ")).await;
}
