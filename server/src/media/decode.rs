//! Image bytes to pixels, refusing what should not be decoded: `data:` URLs (base64 only),
//! the declared MIME type against the bytes' own signature, the declared dimensions before any
//! pixel is decoded (decoding bombs), allocation limits while decoding (`image::Limits`),
//! corrupt or truncated data. Every refusal is a message for a 400.

use std::io::Cursor;

use base64::Engine as _;
use image::{ImageFormat, ImageReader};

/// Limits on one image (or video frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest decoded (base64-decoded) image file, in bytes.
    pub max_bytes: usize,
    /// Largest width x height.
    pub max_pixels: u64,
}

/// The image formats a request may send, by MIME type.
fn format_of_mime(mime: &str) -> Option<ImageFormat> {
    match mime {
        "image/png" => Some(ImageFormat::Png),
        "image/jpeg" | "image/jpg" => Some(ImageFormat::Jpeg),
        "image/webp" => Some(ImageFormat::WebP),
        _ => None,
    }
}

fn name(f: ImageFormat) -> &'static str {
    match f {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::WebP => "WebP",
        _ => "another format",
    }
}

/// The MIME type and bytes of a `data:<mime>;base64,<data>` URL.
pub fn data_url(url: &str, max_bytes: usize) -> Result<(String, Vec<u8>), String> {
    let rest = url
        .strip_prefix("data:")
        .ok_or_else(|| "not a data: URL".to_string())?;
    let (head, data) = rest
        .split_once(',')
        .ok_or_else(|| "a data: URL needs a comma before its data".to_string())?;
    let mut parts = head.split(';');
    let mime = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    if !parts.any(|p| p.trim().eq_ignore_ascii_case("base64")) {
        return Err("the data: URL must be base64 (`data:image/png;base64,...`)".into());
    }
    // Base64 holds 3 bytes per 4 characters: refuse before decoding what cannot fit.
    let approx = data.len() / 4 * 3;
    if approx > max_bytes + 3 {
        return Err(format!(
            "the image is about {approx} bytes, over the limit of {max_bytes} (--media-max-bytes)"
        ));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| format!("the data: URL's base64 is invalid: {e}"))?;
    if bytes.len() > max_bytes {
        return Err(format!(
            "the image is {} bytes, over the limit of {max_bytes} (--media-max-bytes)",
            bytes.len()
        ));
    }
    Ok((mime, bytes))
}

/// Decodes `bytes` declared as `mime` into RGB pixels (alpha dropped): `(width, height, rgb)`.
pub fn decode(mime: &str, bytes: &[u8], lim: ImageLimits) -> Result<(u32, u32, Vec<u8>), String> {
    if mime.starts_with("video/") {
        return Err(format!(
            "video data URLs ({mime}) are not decoded (memra has no video decoder); send the \
             video as a list of frames: {{\"type\": \"video\", \"video\": [\"data:image/jpeg;base64,...\", ...]}}"
        ));
    }
    let want = format_of_mime(mime).ok_or_else(|| {
        format!("unsupported image type `{mime}` (PNG, JPEG and WebP are accepted)")
    })?;
    let found = image::guess_format(bytes).map_err(|_| {
        format!(
            "the data is not a {} image (no known signature)",
            name(want)
        )
    })?;
    if found != want {
        return Err(format!(
            "the data URL says {mime} but the data is {}",
            name(found)
        ));
    }
    if want == ImageFormat::Jpeg && !jpeg_complete(bytes) {
        return Err(
            "the JPEG data is truncated (no end-of-image marker after its last scan)".into(),
        );
    }
    let reader = || {
        let mut r = ImageReader::with_format(Cursor::new(bytes), want);
        let mut l = image::Limits::default();
        let side = lim.max_pixels.min(u32::MAX as u64) as u32;
        l.max_image_width = Some(side);
        l.max_image_height = Some(side);
        // The decoded image (up to 4 bytes per pixel at 8 bits, 8 at 16) plus the decoder's own
        // buffers.
        l.max_alloc = Some(lim.max_pixels.saturating_mul(8).saturating_add(64 << 20));
        r.limits(l);
        r
    };
    let (w, h) = reader()
        .into_dimensions()
        .map_err(|e| format!("the {} header is unreadable: {e}", name(want)))?;
    let pixels = w as u64 * h as u64;
    if w == 0 || h == 0 || pixels > lim.max_pixels {
        return Err(format!(
            "the image declares {w}x{h} = {pixels} pixels; the limit is {} (--media-max-pixels)",
            lim.max_pixels
        ));
    }
    // A decoder that panics on hostile data must not take the server down.
    let decoded = std::panic::catch_unwind(|| reader().decode())
        .map_err(|_| format!("the {} data could not be decoded", name(want)))?
        .map_err(|e| format!("the {} data is corrupt or truncated: {e}", name(want)))?;
    let rgb = decoded.to_rgb8();
    Ok((rgb.width(), rgb.height(), rgb.into_raw()))
}

/// Whether a JPEG's last scan (`FF DA`) is followed by an end-of-image marker (`FF D9`): the
/// JPEG decoder fills a truncated scan with gray instead of failing. Inside entropy-coded data
/// `FF` is always stuffed (`FF 00`), so `FF D9` there is the marker; an EXIF thumbnail's own
/// end marker comes before the main image's scans.
fn jpeg_complete(b: &[u8]) -> bool {
    let last = |m: u8| b.windows(2).rposition(|w| w == [0xFF, m]);
    matches!((last(0xDA), last(0xD9)), (Some(sos), Some(eoi)) if eoi > sos)
}

/// `rgb` (`w x h`) resized to `to = (width, height)`: bilinear (Gemma 3's processor: to its
/// square, aspect ratio not kept) or bicubic (Qwen's: to multiples of its patch blocks, aspect
/// ratio kept as well as they allow).
pub fn resize(w: u32, h: u32, rgb: Vec<u8>, to: (u32, u32), bicubic: bool) -> Vec<u8> {
    let (tw, th) = to;
    if (w, h) == (tw, th) {
        return rgb;
    }
    let Some(img) = image::RgbImage::from_raw(w, h, rgb) else {
        return vec![0; (tw * th * 3) as usize];
    };
    let filter = match bicubic {
        true => image::imageops::FilterType::CatmullRom,
        false => image::imageops::FilterType::Triangle,
    };
    image::imageops::resize(&img, tw, th, filter).into_raw()
}
