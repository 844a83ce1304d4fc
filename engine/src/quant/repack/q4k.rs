//! The scale bytes of a Q4_K tile (kernels/cu/wfmt.cuh `FmtQ4_K`). A GGUF Q4_K block carries
//! f16 d, f16 dmin and eight 6-bit (scale, min) pairs packed into 12 bytes; the tile keeps the
//! same numbers unpacked to one byte each, placed so that lane (g, t) reads the pairs of its
//! two rows g and g + 8 for sub-block j as one word:
//!   [2048, 2304): word (g, j) at 2048 + (g * 8 + j) * 4 = [sc(g, j), m(g, j), sc(g + 8, j),
//!                 m(g + 8, j)];
//!   [2304, 2368): row r's d and dmin (the GGUF f16 bytes) at 2304 + r * 4.
//! The 12-byte packing is a bijection onto 16 six-bit values, so [`get_head`] gives back the
//! GGUF bytes exactly.

/// The 6-bit scale and min of sub-block `j` from the 12 packed bytes (GGUF's order).
fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 12 packed bytes of eight (scale, min) pairs: the inverse of [`scale_min`].
fn pack(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for i in 0..4 {
        s[i] = sc[i] | ((sc[i + 4] >> 4) << 6);
        s[i + 4] = m[i] | ((m[i + 4] >> 4) << 6);
        s[i + 8] = (sc[i + 4] & 0x0f) | ((m[i + 4] & 0x0f) << 4);
    }
    s
}

fn pair_at(row: usize, j: usize) -> usize {
    2048 + ((row % 8) * 8 + j) * 4 + 2 * (row / 8)
}

/// Writes row `row`'s 16-byte GGUF head (d, dmin, 12 scale bytes) into `tile`.
pub(super) fn put_head(tile: &mut [u8], row: usize, head: &[u8]) {
    for j in 0..8 {
        let (sc, m) = scale_min(&head[4..16], j);
        let at = pair_at(row, j);
        tile[at] = sc;
        tile[at + 1] = m;
    }
    tile[2304 + row * 4..2304 + row * 4 + 4].copy_from_slice(&head[..4]);
}

/// Row `row`'s 16-byte GGUF head back out of `tile`.
pub(super) fn get_head(tile: &[u8], row: usize) -> Vec<u8> {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        let at = pair_at(row, j);
        sc[j] = tile[at];
        m[j] = tile[at + 1];
    }
    let mut h = tile[2304 + row * 4..2304 + row * 4 + 4].to_vec();
    h.extend_from_slice(&pack(&sc, &m));
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_is_a_bijection() {
        let mut x = 12345u32;
        for _ in 0..2000 {
            let mut s = [0u8; 12];
            for b in s.iter_mut() {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = (x >> 24) as u8;
            }
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            for j in 0..8 {
                (sc[j], m[j]) = scale_min(&s, j);
                assert!(sc[j] < 64 && m[j] < 64);
            }
            assert_eq!(pack(&sc, &m), s);
        }
    }

    #[test]
    fn lane_words_hold_both_rows() {
        let mut tile = vec![0u8; 2368];
        // Row 3: sub-block 5 has scale 41 and min 22; row 11 (= 3 + 8): 7 and 60.
        let head = |sc5: u8, m5: u8| {
            let mut sc = [1u8; 8];
            let mut m = [2u8; 8];
            sc[5] = sc5;
            m[5] = m5;
            let mut h = vec![0x11, 0x22, 0x33, 0x44];
            h.extend_from_slice(&pack(&sc, &m));
            h
        };
        put_head(&mut tile, 3, &head(41, 22));
        put_head(&mut tile, 11, &head(7, 60));
        assert_eq!(&tile[2048 + (3 * 8 + 5) * 4..][..4], &[41, 22, 7, 60]);
        assert_eq!(&tile[2304 + 11 * 4..][..4], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(get_head(&tile, 11), head(7, 60));
    }
}
