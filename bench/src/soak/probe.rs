//! What the soak samples: a process's resident memory and open file descriptors (from
//! /proc/<pid>), and the server's KV blocks in use / free from its `/metrics` text. The pid is
//! given or discovered as the process that owns the listening socket of the server's port.

use std::path::Path;

/// Resident set size in bytes from the text of /proc/<pid>/status (`VmRSS:  1234 kB`).
pub fn rss_bytes(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}

/// The value of the unlabelled sample `name` in Prometheus / OpenMetrics text
/// (`memra_kv_blocks_used 12`). `None` when absent or not a number.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let v = rest.strip_prefix(' ')?;
            v.split_whitespace().next()?.parse::<f64>().ok()
        })
        .filter(|v| v.is_finite())
}

/// The socket inodes listening on TCP `port` in the text of /proc/net/tcp or /proc/net/tcp6
/// (state `0A`, local address `HEX_IP:HEX_PORT`).
pub fn listening_inodes(net_tcp: &str, port: u16) -> Vec<u64> {
    net_tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local = f.get(1)?;
            let state = f.get(3)?;
            let inode = f.get(9)?;
            let p = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            (p == port && *state == "0A")
                .then(|| inode.parse::<u64>().ok())
                .flatten()
        })
        .filter(|&i| i != 0)
        .collect()
}

/// One process's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcSample {
    pub rss_bytes: u64,
    pub fds: u64,
}

/// Reads /proc/<pid>/status and counts /proc/<pid>/fd. Errors name the file.
pub fn proc_sample(pid: u32) -> Result<ProcSample, String> {
    let base = Path::new("/proc").join(pid.to_string());
    let status = std::fs::read_to_string(base.join("status"))
        .map_err(|e| format!("{}/status: {e}", base.display()))?;
    let rss_bytes =
        rss_bytes(&status).ok_or_else(|| format!("{}/status: no VmRSS line", base.display()))?;
    let fds = std::fs::read_dir(base.join("fd"))
        .map_err(|e| format!("{}/fd: {e}", base.display()))?
        .count() as u64;
    Ok(ProcSample { rss_bytes, fds })
}

/// The pid of the process listening on TCP `port` (this user's processes only: the others'
/// fd folders are unreadable). An error says to pass `--pid` when none or several are found.
pub fn discover_pid(port: u16) -> Result<u32, String> {
    let mut inodes = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(t) = std::fs::read_to_string(f) {
            inodes.extend(listening_inodes(&t, port));
        }
    }
    if inodes.is_empty() {
        return Err(format!(
            "no process listens on port {port}; start the server or pass --pid"
        ));
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut found = Vec::new();
    let procs = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let owns = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|l| wanted.iter().any(|w| l.as_os_str() == w.as_str()))
        });
        if owns {
            found.push(pid);
        }
    }
    match found.as_slice() {
        [pid] => Ok(*pid),
        [] => Err(format!(
            "the socket listening on port {port} belongs to no process of this user; pass --pid"
        )),
        many => Err(format!(
            "processes {many:?} hold the socket listening on port {port}; pass --pid"
        )),
    }
}

/// The port of `host:port` (IPv6 `[::1]:8080` too).
pub fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_from_the_status_text() {
        let s = "Name:\tmemra-server\nVmPeak:\t  999 kB\nVmRSS:\t   95312 kB\nThreads:\t9\n";
        assert_eq!(rss_bytes(s), Some(95312 * 1024));
        assert_eq!(rss_bytes("Name:\tx\n"), None);
        assert_eq!(rss_bytes("VmRSS:\t lots kB\n"), None);
        assert_eq!(rss_bytes("VmRSS:\t 12 MB\n"), None);
    }

    #[test]
    fn metrics_are_read_by_exact_name() {
        let t = "# HELP memra_kv_blocks_used KV cache blocks in use.\n\
                 # TYPE memra_kv_blocks_used gauge\n\
                 memra_kv_blocks_used_total 99\n\
                 memra_kv_blocks_used 17\n\
                 memra_kv_blocks_free 4079\n\
                 memra_requests_total{route=\"/v1/completions\",status=\"200\",tenant=\"\"} 3\n\
                 memra_bad NaN\n# EOF\n";
        assert_eq!(metric(t, "memra_kv_blocks_used"), Some(17.0));
        assert_eq!(metric(t, "memra_kv_blocks_free"), Some(4079.0));
        assert_eq!(metric(t, "memra_requests_total"), None, "labelled");
        assert_eq!(metric(t, "memra_bad"), None);
        assert_eq!(metric(t, "memra_missing"), None);
    }

    #[test]
    fn the_listening_socket_of_a_port_is_found() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0\n\
   1: 0100007F:1F90 0100007F:D2B4 01 00000000:00000000 00:00000000 00000000     0        0 5151 1 0\n\
   2: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6161 1 0\n\
   3: garbage\n";
        assert_eq!(listening_inodes(t, 8080), vec![4242]);
        assert_eq!(listening_inodes(t, 8081), vec![6161]);
        assert!(listening_inodes(t, 9).is_empty());
    }

    #[test]
    fn this_process_can_be_sampled_and_found_by_its_port() {
        let me = proc_sample(std::process::id()).unwrap();
        assert!(me.rss_bytes > 0 && me.fds > 0, "{me:?}");
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(discover_pid(port), Ok(std::process::id()));
        drop(l);
        assert!(discover_pid(port).unwrap_err().contains("--pid"));
        assert_eq!(port_of("127.0.0.1:8080"), Some(8080));
        assert_eq!(port_of("[::1]:9000"), Some(9000));
        assert_eq!(port_of("nohost"), None);
    }
}
