//! Memory limits the KV pool must fit in besides free memory: the address-space limit
//! (`ulimit -v`, RLIMIT_AS, read from /proc/self/limits against VmSize) and the cgroup v2
//! memory limit (memory.max against memory.current). Read from /proc and /sys: no libc needed.

use std::path::Path;

/// `avail` lowered to the room left under the process's address-space and cgroup limits.
pub fn headroom(avail: usize) -> usize {
    let mut room = avail;
    if let (Some(limit), Some(used)) = (address_space_limit(), vm_size()) {
        room = room.min(limit.saturating_sub(used));
    }
    if let Some(left) = cgroup_room() {
        room = room.min(left);
    }
    room
}

/// The soft RLIMIT_AS in bytes, `None` when unlimited or unreadable.
fn address_space_limit() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_limits_as(&s)
}

/// The soft limit of the `Max address space` row of /proc/self/limits.
pub fn parse_limits_as(s: &str) -> Option<usize> {
    let row = s.lines().find(|l| l.starts_with("Max address space"))?;
    let soft = row
        .trim_start_matches("Max address space")
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

/// VmSize of /proc/self/status in bytes.
fn vm_size() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kb| kb * 1024)
}

/// memory.max - memory.current of this process's cgroup (v2); `None` when unlimited.
fn cgroup_room() -> Option<usize> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let max = read("memory.max")?.trim().parse::<usize>().ok()?;
    let cur = read("memory.current")?.trim().parse::<usize>().unwrap_or(0);
    Some(max.saturating_sub(cur))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_row_parses() {
        let s = "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max stack size            8388608              unlimited            bytes\n\
                 Max address space         6144000000           unlimited            bytes\n";
        assert_eq!(parse_limits_as(s), Some(6_144_000_000));
        let u = "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(parse_limits_as(u), None);
    }

    #[test]
    fn headroom_never_exceeds_available() {
        assert!(headroom(1 << 20) <= 1 << 20);
    }
}
