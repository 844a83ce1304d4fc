//! Images and video frames in chat requests: the content parts as parsed
//! (`{"type": "image_url", "image_url": {"url": ...}}`, `{"type": "video", "video": [frame
//! URLs], "fps": F}`), the limits, and turning them into the prompt's image tokens and the
//! engine's [`MediaSpan`]s ([`expand`], run in the tokenizer pool off the executor).
//!
//! Where an image sits in a message, its text holds [`MARKER`]; the tokenizer splits there
//! (`Tokenizer::encode_chat_media`) and each marker becomes the model's image tokens (Gemma 3:
//! `<start_of_image>`, one soft token per embedding row, `<end_of_image>`), the rows of the
//! soft tokens given by the vision tower. A video's frames are images on Gemma 3's tower; the
//! Qwen ViT takes them as the model's own video ([`video`]).

pub mod decode;
pub mod fetch;
pub mod video;
pub mod vision;

use std::collections::HashMap;
use std::sync::Arc;

use memra_engine::vision::MediaSpan;

use crate::errors::ApiError;
pub use decode::ImageLimits;
pub use vision::Vision;

/// Stands for one image or video in a message's text (U+FFFC, the object replacement
/// character). A request with media may not use it in its text.
pub const MARKER: &str = "\u{FFFC}";

/// One image or video of a request, where it came from (`param` names it in errors).
#[derive(Clone, Debug, PartialEq)]
pub enum MediaRef {
    Image {
        url: String,
        param: String,
    },
    /// Frames (image URLs) in order; `fps`: the rate they were taken at (default 1).
    Video {
        frames: Vec<String>,
        fps: Option<f32>,
        param: String,
    },
}

/// The media limits of the server (flags `--media-*`).
#[derive(Clone, Debug, PartialEq)]
pub struct MediaLimits {
    pub image: ImageLimits,
    /// Images plus video frames in one request (after sampling).
    pub max_images: usize,
    /// Frames of one video after sampling at `video_fps`.
    pub max_frames: usize,
    /// The rate frames are sampled at: a video sent at `fps` keeps about `video_fps / fps` of
    /// its frames (evenly); never more than it has.
    pub video_fps: f32,
    /// Hosts image URLs may name (`http://host/...`, fetched by [`fetch_allowed`]); empty:
    /// remote URLs are refused.
    pub allowed_hosts: Vec<String>,
}

impl Default for MediaLimits {
    fn default() -> Self {
        MediaLimits {
            image: ImageLimits {
                max_bytes: 8 << 20,
                max_pixels: 4096 * 4096,
            },
            max_images: 8,
            max_frames: 8,
            video_fps: 1.0,
            allowed_hosts: Vec::new(),
        }
    }
}

/// The frame indices of `n` frames taken at `fps` that sampling at `target` keeps: frame `i`
/// is kept when `floor(i * target / fps)` moves on (the first always).
pub fn sample_frames(n: usize, fps: f32, target: f32) -> Vec<usize> {
    if !(fps > 0.0 && target > 0.0) || target >= fps {
        return (0..n).collect();
    }
    let r = target as f64 / fps as f64;
    let mut last = None;
    (0..n)
        .filter(|&i| {
            let slot = (i as f64 * r).floor() as u64;
            let keep = last != Some(slot);
            last = Some(slot);
            keep
        })
        .collect()
}

/// The host of an `http(s)://` URL.
fn host_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let auth = rest.split(['/', '?', '#']).next()?;
    let auth = auth.rsplit('@').next()?;
    Some(auth.split(':').next().unwrap_or(auth))
}

/// Images fetched from allowed hosts, by URL ([`fetch_allowed`]).
pub type Fetched = HashMap<String, (String, Vec<u8>)>;

/// Whether `url` names an allowed host.
fn allowed(url: &str, lim: &MediaLimits) -> bool {
    host_of(url).is_some_and(|h| lim.allowed_hosts.iter().any(|a| a.eq_ignore_ascii_case(h)))
}

/// Fetches every image URL of `media` on an allowed host (other URLs are left to
/// [`decode_all`], which refuses remote ones). A failed fetch is a 400 naming the part.
pub async fn fetch_allowed(media: &[MediaRef], lim: &MediaLimits) -> Result<Fetched, ApiError> {
    let mut out = Fetched::new();
    for m in media {
        let urls: Vec<(&str, String)> = match m {
            MediaRef::Image { url, param } => vec![(url.as_str(), param.clone())],
            MediaRef::Video { frames, param, .. } => frames
                .iter()
                .enumerate()
                .map(|(i, f)| (f.as_str(), format!("{param}[{i}]")))
                .collect(),
        };
        for (url, param) in urls {
            if allowed(url, lim) && !out.contains_key(url) {
                if out.len() >= lim.max_images {
                    return Err(ApiError::param(
                        &param,
                        format!(
                            "more than {} remote images (--media-max-images)",
                            lim.max_images
                        ),
                    ));
                }
                let got = fetch::fetch(url, lim.image.max_bytes)
                    .await
                    .map_err(|e| ApiError::param(&param, e))?;
                out.insert(url.to_string(), got);
            }
        }
    }
    Ok(out)
}

/// The bytes of one image URL: a `data:` URL's, a fetched one's, or refused (remote URLs whose
/// host is not allowed).
fn image_bytes(
    url: &str,
    param: &str,
    lim: &MediaLimits,
    fetched: &Fetched,
) -> Result<(String, Vec<u8>), ApiError> {
    if url.starts_with("data:") {
        return decode::data_url(url, lim.image.max_bytes).map_err(|e| ApiError::param(param, e));
    }
    if let Some(got) = fetched.get(url) {
        return Ok(got.clone());
    }
    match host_of(url) {
        Some(h) => Err(ApiError::param(
            param,
            format!(
                "remote image URLs are refused (host `{h}` is not in --media-allowed-hosts); \
                 send the image as a data: URL"
            ),
        )),
        None => Err(ApiError::param(
            param,
            "an image URL must be a data: URL (`data:image/png;base64,...`)",
        )),
    }
}

/// One decoded image, resized to the tower's input size: `width x height` RGB pixels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pixels {
    pub width: u32,
    pub height: u32,
    pub rgb: Vec<u8>,
}

/// Where images are resized to: the tower's input size of a `w x h` image (an error for a
/// size it refuses), and whether bicubic (else bilinear).
pub struct Target<'a> {
    pub size: &'a dyn Fn(u32, u32) -> Result<(u32, u32), String>,
    pub bicubic: bool,
}

/// The tower's input pixels of one image URL: at the input size of its own size, or (a video's
/// frames after its first) at `fixed`.
fn image_pixels(
    url: &str,
    param: &str,
    lim: &MediaLimits,
    fetched: &Fetched,
    to: &Target<'_>,
    fixed: Option<(u32, u32)>,
) -> Result<Pixels, ApiError> {
    let (mime, bytes) = image_bytes(url, param, lim, fetched)?;
    let (w, h, rgb) =
        decode::decode(&mime, &bytes, lim.image).map_err(|e| ApiError::param(param, e))?;
    let (tw, th) = match fixed {
        Some(s) => s,
        None => (to.size)(w, h).map_err(|e| ApiError::param(param, e))?,
    };
    Ok(Pixels {
        width: tw,
        height: th,
        rgb: decode::resize(w, h, rgb, (tw, th), to.bicubic),
    })
}

/// One image or video of a request, decoded: its pixels at the tower's input size (an image's
/// one; a video's kept frames, all at its first frame's input size) and a video's clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub frames: Vec<Pixels>,
    /// A video: when its kept frames were taken, and its part (`param` in errors).
    pub video: Option<(memra_engine::vision::video::Clock, String)>,
}

/// Decodes every image and frame of `media` (one entry per [`MARKER`]), in order.
pub fn decode_all(
    media: &[MediaRef],
    lim: &MediaLimits,
    fetched: &Fetched,
    to: &Target<'_>,
) -> Result<Vec<Decoded>, ApiError> {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(media.len());
    for m in media {
        out.push(match m {
            MediaRef::Image { url, param } => {
                total += 1;
                check_total(total, lim, param)?;
                Decoded {
                    frames: vec![image_pixels(url, param, lim, fetched, to, None)?],
                    video: None,
                }
            }
            MediaRef::Video { frames, fps, param } => {
                let fps = fps.unwrap_or(1.0);
                let keep = sample_frames(frames.len(), fps, lim.video_fps);
                if keep.len() > lim.max_frames {
                    return Err(ApiError::param(
                        param,
                        format!(
                            "the video has {} frames after sampling at {} fps; at most {} \
                             (--media-max-frames)",
                            keep.len(),
                            lim.video_fps,
                            lim.max_frames
                        ),
                    ));
                }
                total += keep.len();
                check_total(total, lim, param)?;
                let mut px: Vec<Pixels> = Vec::with_capacity(keep.len());
                for &i in &keep {
                    let fixed = px.first().map(|f| (f.width, f.height));
                    let at = format!("{param}[{i}]");
                    px.push(image_pixels(&frames[i], &at, lim, fetched, to, fixed)?);
                }
                let sampled = match lim.video_fps > 0.0 && lim.video_fps < fps {
                    true => lim.video_fps,
                    false => fps,
                };
                let clock = memra_engine::vision::video::Clock {
                    indices: keep,
                    fps: fps as f64,
                    sampled_fps: sampled as f64,
                };
                Decoded {
                    frames: px,
                    video: Some((clock, param.clone())),
                }
            }
        });
    }
    Ok(out)
}

fn check_total(total: usize, lim: &MediaLimits, param: &str) -> Result<(), ApiError> {
    if total > lim.max_images {
        return Err(ApiError::param(
            param,
            format!(
                "more than {} images and video frames in one request (--media-max-images)",
                lim.max_images
            ),
        ));
    }
    Ok(())
}

/// An encoded image or video: its content hash, embedding rows, token grid `(rows, cols)` (a
/// video's: each frame group's), a video's group times ([`MediaSpan::times`]; empty for an
/// image and a Qwen3-VL frame group) and whether its tokens are a video's.
#[derive(Clone, Debug)]
pub struct Embedded {
    pub hash: u128,
    pub embeds: Arc<[f32]>,
    pub grid: (usize, usize),
    pub times: Vec<u32>,
    pub video: bool,
}

/// The prompt ids with each marker's images spliced in at `at` (indices into `ids`, one per
/// entry of `images`), and the engine's spans of the soft tokens.
pub fn splice(
    ids: Vec<u32>,
    at: &[usize],
    images: Vec<Vec<Embedded>>,
    v: &Vision,
) -> (Vec<u32>, Vec<MediaSpan>) {
    let width = v.tower.out_width();
    let mut out = Vec::with_capacity(ids.len() + images.len() * (v.tower.tokens_per_image() + 2));
    let mut spans = Vec::new();
    let mut from = 0;
    for (&pos, imgs) in at.iter().zip(images) {
        out.extend_from_slice(&ids[from..pos]);
        from = pos;
        for e in imgs {
            let rows = e.embeds.len() / width.max(1);
            let (toks, first) = match e.video {
                true => v.tokens.expand_video(rows),
                false => v.tokens.expand(rows),
            };
            spans.push(MediaSpan {
                start: out.len() + first,
                embeds: e.embeds,
                width,
                hash: e.hash,
                grid: Some(e.grid),
                times: e.times,
            });
            out.extend(toks);
        }
    }
    out.extend_from_slice(&ids[from..]);
    (out, spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_sampled_evenly() {
        assert_eq!(sample_frames(4, 1.0, 1.0), vec![0, 1, 2, 3]);
        assert_eq!(sample_frames(8, 4.0, 1.0), vec![0, 4]);
        assert_eq!(sample_frames(9, 2.0, 1.0), vec![0, 2, 4, 6, 8]);
        assert_eq!(sample_frames(3, 1.0, 30.0), vec![0, 1, 2]);
    }

    #[test]
    fn hosts_are_read_from_urls() {
        assert_eq!(host_of("https://a.example/x.png"), Some("a.example"));
        assert_eq!(host_of("http://u:p@b.example:8080/x"), Some("b.example"));
        assert_eq!(host_of("ftp://c/x"), None);
    }
}
