//! What the host gives the process: the CPUs it may use, and open files.
//!
//! The CPUs: [`usable_cpus`] is the answer everything is sized from - the
//! standard library's `available_parallelism`, which on Linux takes the
//! affinity mask (`taskset`) and the cgroup CPU quota into account.
//! [`CpuReport`] says for the start log what was found on the way.
//!
//! Open files: [`raise_open_files_limit`] lifts the soft `RLIMIT_NOFILE` to
//! the hard limit at start, so the server can hold as many connections as
//! the host allows, and reports both. Counting the descriptors in use
//! (`/proc/self/fd`) per accepted connection would cost a directory read
//! each time, so admission instead takes the caller's count of open
//! connections and the soft limit reported here
//! ([`crate::admission::Admission::on_accept`]); `open_files_headroom`
//! covers the descriptors that are not connections.

use std::fmt;
use std::path::Path;

/// The CPUs the process may use: `std::thread::available_parallelism()`,
/// or 1 when it cannot tell.
pub fn usable_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A cgroup CPU quota: `quota_us` of CPU time per `period_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupQuota {
    /// The cgroup version the quota came from (1 or 2).
    pub version: u8,
    /// CPU time per period, microseconds; `None` = no quota (`max`, -1).
    pub quota_us: Option<u64>,
    /// The period, microseconds.
    pub period_us: u64,
}

impl CgroupQuota {
    /// The quota in CPUs (2.5 for 250 ms per 100 ms), `None` without one.
    pub fn cpus(&self) -> Option<f64> {
        let q = self.quota_us?;
        (self.period_us > 0).then(|| q as f64 / self.period_us as f64)
    }
}

/// What the process found about its CPUs, for the start log.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuReport {
    /// The answer: [`usable_cpus`].
    pub usable: usize,
    /// CPUs in the affinity mask (`Cpus_allowed_list` in
    /// `/proc/self/status`), when readable.
    pub affinity: Option<usize>,
    /// The cgroup CPU quota, when a cgroup CPU controller was found.
    pub cgroup: Option<CgroupQuota>,
}

impl CpuReport {
    /// Looks at this process (Linux files; elsewhere only `usable`).
    pub fn detect() -> Self {
        let affinity = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| affinity_from_status(&s));
        CpuReport {
            usable: usable_cpus(),
            affinity,
            cgroup: cgroup_quota(Path::new("/")),
        }
    }
}

impl fmt::Display for CpuReport {
    /// `2 CPUs usable (affinity mask: 2; cgroup v2 quota: none)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} CPU{} usable (affinity mask: ",
            self.usable,
            if self.usable == 1 { "" } else { "s" }
        )?;
        match self.affinity {
            Some(n) => write!(f, "{n}")?,
            None => f.write_str("unknown")?,
        }
        match self.cgroup {
            Some(q) => match q.cpus() {
                Some(cpus) => write!(
                    f,
                    "; cgroup v{} quota: {cpus:.2} CPUs ({} us per {} us))",
                    q.version,
                    q.quota_us.unwrap_or(0),
                    q.period_us
                ),
                None => write!(f, "; cgroup v{} quota: none)", q.version),
            },
            None => f.write_str("; cgroup quota: not found)"),
        }
    }
}

/// The CPUs of a `Cpus_allowed_list` line in `/proc/self/status`.
pub fn affinity_from_status(status: &str) -> Option<usize> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|list| cpu_list_count(list.trim()))
}

/// The number of CPUs in a list like `0-3,8,10-11`.
pub fn cpu_list_count(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// A cgroup v2 `cpu.max` (`max 100000`, `250000 100000`).
pub fn parse_cpu_max(text: &str) -> Option<CgroupQuota> {
    let mut it = text.split_whitespace();
    let quota = it.next()?;
    let period_us = it.next().map_or(Some(100_000), |p| p.parse().ok())?;
    let quota_us = match quota {
        "max" => None,
        q => Some(q.parse().ok()?),
    };
    Some(CgroupQuota {
        version: 2,
        quota_us,
        period_us,
    })
}

/// cgroup v1 `cpu.cfs_quota_us` (-1 = none) and `cpu.cfs_period_us`.
pub fn parse_cfs(quota: &str, period: &str) -> Option<CgroupQuota> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period_us: u64 = period.trim().parse().ok()?;
    Some(CgroupQuota {
        version: 1,
        quota_us: u64::try_from(quota).ok(),
        period_us,
    })
}

/// The cgroup path of the process for the v2 hierarchy (`0::/path` in
/// `/proc/self/cgroup`).
fn cgroup_v2_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim)
}

/// The CPU quota of the process's cgroup under `root` (`/` on a live
/// system): v2 `cpu.max` of its own cgroup, else of the hierarchy's root
/// (inside a container's cgroup namespace that is the container's), else
/// v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
pub fn cgroup_quota(root: &Path) -> Option<CgroupQuota> {
    let read = |p: &str| std::fs::read_to_string(root.join(p.trim_start_matches('/'))).ok();
    let own = read("/proc/self/cgroup")
        .as_deref()
        .and_then(cgroup_v2_path)
        .filter(|p| *p != "/")
        .map(|p| format!("/sys/fs/cgroup{p}/cpu.max"));
    for path in own
        .iter()
        .map(String::as_str)
        .chain(["/sys/fs/cgroup/cpu.max"])
    {
        if let Some(q) = read(path).as_deref().and_then(parse_cpu_max) {
            return Some(q);
        }
    }
    for dir in ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"] {
        if let (Some(q), Some(p)) = (
            read(&format!("{dir}/cpu.cfs_quota_us")),
            read(&format!("{dir}/cpu.cfs_period_us")),
        ) {
            if let Some(q) = parse_cfs(&q, &p) {
                return Some(q);
            }
        }
    }
    None
}

/// The open-files limits (`RLIMIT_NOFILE`); `None` is unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit in force.
    pub soft: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
    /// The soft limit before [`raise_open_files_limit`] (equal to `soft`
    /// when nothing was raised).
    pub soft_before: Option<u64>,
    /// Why raising failed, when it did.
    pub error: Option<String>,
}

impl OpenFiles {
    /// The limits now, nothing changed.
    pub fn current() -> Self {
        let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        OpenFiles {
            soft: l.current,
            hard: l.maximum,
            soft_before: l.current,
            error: None,
        }
    }
}

impl fmt::Display for OpenFiles {
    /// `open files: soft limit 1048576 (raised from 1024), hard 1048576`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        write!(f, "open files: soft limit {}", show(self.soft))?;
        if self.soft_before != self.soft {
            write!(f, " (raised from {})", show(self.soft_before))?;
        }
        write!(f, ", hard {}", show(self.hard))?;
        if let Some(e) = &self.error {
            write!(f, " (could not raise the soft limit: {e})")?;
        }
        Ok(())
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (once, at start) and
/// reports both. On failure the limits stay as they were and `error` says
/// why.
pub fn raise_open_files_limit() -> OpenFiles {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let mut report = OpenFiles {
        soft: before.current,
        hard: before.maximum,
        soft_before: before.current,
        error: None,
    };
    if before.current == before.maximum {
        return report;
    }
    let wanted = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, wanted) {
        Ok(()) => report.soft = getrlimit(Resource::Nofile).current,
        Err(e) => report.error = Some(e.to_string()),
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(cpu_list_count("0-3,8,10-11"), Some(7));
        assert_eq!(cpu_list_count("0"), Some(1));
        assert_eq!(cpu_list_count("0-1\n"), Some(2));
        assert_eq!(cpu_list_count(""), None);
        assert_eq!(cpu_list_count("3-1"), None);
        assert_eq!(cpu_list_count("x"), None);
        assert_eq!(
            affinity_from_status("Name:\tuascale\nCpus_allowed:\tf\nCpus_allowed_list:\t0-3\n"),
            Some(4)
        );
    }

    #[test]
    fn cgroup_quotas_are_read() {
        assert_eq!(parse_cpu_max("250000 100000\n").unwrap().cpus(), Some(2.5));
        let none = parse_cpu_max("max 100000\n").unwrap();
        assert_eq!(none.cpus(), None);
        assert_eq!(none.version, 2);
        assert_eq!(parse_cpu_max(""), None);
        let v1 = parse_cfs("50000\n", "100000\n").unwrap();
        assert_eq!((v1.version, v1.cpus()), (1, Some(0.5)));
        assert_eq!(parse_cfs("-1", "100000").unwrap().cpus(), None);
        assert_eq!(cgroup_v2_path("0::/user.slice/x\n"), Some("/user.slice/x"));
        assert_eq!(cgroup_v2_path("12:cpu,cpuacct:/\n"), None);
    }

    #[test]
    fn a_cgroup_tree_is_searched() {
        let root = std::env::temp_dir().join(format!("uascale-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::create_dir_all(root.join("sys/fs/cgroup/app")).unwrap();
        std::fs::write(root.join("proc/self/cgroup"), "0::/app\n").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/cpu.max"), "max 100000\n").unwrap();
        std::fs::write(root.join("sys/fs/cgroup/app/cpu.max"), "150000 100000\n").unwrap();
        assert_eq!(cgroup_quota(&root).unwrap().cpus(), Some(1.5));
        std::fs::remove_file(root.join("sys/fs/cgroup/app/cpu.max")).unwrap();
        assert_eq!(cgroup_quota(&root).unwrap().cpus(), None);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(cgroup_quota(&root), None);
    }

    #[test]
    fn the_report_reads() {
        let r = CpuReport {
            usable: 2,
            affinity: Some(4),
            cgroup: Some(CgroupQuota {
                version: 2,
                quota_us: Some(200_000),
                period_us: 100_000,
            }),
        };
        assert_eq!(
            r.to_string(),
            "2 CPUs usable (affinity mask: 4; cgroup v2 quota: 2.00 CPUs (200000 us per 100000 us))"
        );
        let live = CpuReport::detect();
        assert_eq!(live.usable, usable_cpus());
        assert!(live
            .to_string()
            .starts_with(&format!("{} CPU", live.usable)));
        let files = OpenFiles::current();
        assert!(files.to_string().starts_with("open files: soft limit "));
    }

    #[test]
    fn raising_the_limit_reaches_the_hard_limit() {
        let r = raise_open_files_limit();
        if r.error.is_none() {
            assert_eq!(r.soft, r.hard);
            assert_eq!(OpenFiles::current().soft, r.hard);
        }
    }
}
