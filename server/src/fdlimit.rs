//! The open-file limit: raised to the hard limit at start, and the connection cap kept under it.

/// Raises the soft RLIMIT_NOFILE to the hard limit where allowed; returns the soft limit now in
/// force (`None` if it cannot be read).
pub fn raise_nofile() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read only the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur < r.rlim_max {
        let want = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    Some(r.rlim_cur)
}

/// The connection cap that fits under `nofile` open files, keeping 64 for the process's own
/// files (models, keyring, logs) and the listening socket.
pub fn connection_cap(wanted: usize, nofile: Option<u64>) -> usize {
    match nofile {
        Some(n) => wanted.min((n.saturating_sub(64) as usize).max(1)),
        None => wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_fits_under_the_fd_limit() {
        assert_eq!(connection_cap(1024, Some(256)), 192);
        assert_eq!(connection_cap(100, Some(65536)), 100);
        assert_eq!(connection_cap(100, None), 100);
        assert_eq!(connection_cap(100, Some(10)), 1);
        assert!(raise_nofile().is_some_and(|n| n > 0));
    }
}
