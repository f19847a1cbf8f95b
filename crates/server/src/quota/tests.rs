//! The quotas' accounting, the budget from the machine, and the fair
//! share.

use std::path::{Path, PathBuf};

use super::*;

/// A fake root with `files` (path under the root, content).
struct FakeRoot(PathBuf);

impl FakeRoot {
    fn new(name: &str, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("uascale-quota-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, content) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap_or(Path::new("/"))).unwrap();
            std::fs::write(p, content).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        FakeRoot(dir)
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MEMINFO: &str = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n";

#[test]
fn the_budget_is_a_share_of_the_cgroup_limit_else_of_physical_memory() {
    let q = Quotas::default();
    // cgroup v2 with a limit under the machine's memory: the limit.
    let v2 = FakeRoot::new(
        "v2",
        &[
            ("sys/fs/cgroup/memory.max", "4294967296\n"),
            ("proc/meminfo", MEMINFO),
        ],
    );
    assert_eq!(machine_memory(&v2.0), Some(4 << 30));
    assert_eq!(q.resolved(&v2.0).memory_budget_bytes, Some(1 << 30));
    // "max": no cgroup limit, physical memory.
    let unlimited = FakeRoot::new(
        "max",
        &[
            ("sys/fs/cgroup/memory.max", "max\n"),
            ("proc/meminfo", MEMINFO),
        ],
    );
    assert_eq!(machine_memory(&unlimited.0), Some(16_384_000 * 1024));
    // cgroup v1, with its "unlimited" page-rounded i64::MAX.
    let v1 = FakeRoot::new(
        "v1",
        &[
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("proc/meminfo", MEMINFO),
        ],
    );
    assert_eq!(machine_memory(&v1.0), Some(16_384_000 * 1024));
    let v1_limited = FakeRoot::new(
        "v1l",
        &[
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n"),
            ("proc/meminfo", MEMINFO),
        ],
    );
    assert_eq!(machine_memory(&v1_limited.0), Some(1 << 30));
    // A limit above the machine's memory: the machine's.
    let above = FakeRoot::new(
        "above",
        &[
            ("sys/fs/cgroup/memory.max", "68719476736\n"),
            ("proc/meminfo", MEMINFO),
        ],
    );
    assert_eq!(machine_memory(&above.0), Some(16_384_000 * 1024));
    // Nothing readable: no budget.
    let empty = FakeRoot::new("empty", &[]);
    assert_eq!(machine_memory(&empty.0), None);
    assert_eq!(q.resolved(&empty.0).memory_budget_bytes, Some(0));
    // A configured budget and percentage win.
    let set = Quotas {
        memory_budget_bytes: Some(123),
        ..Quotas::default()
    };
    assert_eq!(set.resolved(&v2.0).memory_budget_bytes, Some(123));
    let half = Quotas {
        memory_budget_percent: 50,
        ..Quotas::default()
    };
    assert_eq!(half.resolved(&v2.0).memory_budget_bytes, Some(2 << 30));
    // Resolving twice changes nothing.
    let once = q.resolved(&v2.0);
    assert_eq!(once.resolved(&empty.0), once);
}

fn budget(quotas: Quotas, limit: u64) -> Arc<Budget> {
    Arc::new(Budget::new(quotas, limit))
}

fn account(b: &Arc<Budget>, n: u32) -> Arc<Account> {
    Arc::new(Account::new(Arc::clone(b), NodeId::numeric(1, n)))
}

#[test]
fn monitored_items_are_refused_over_the_session_and_the_client_quota() {
    let b = budget(
        Quotas {
            max_monitored_items_per_session: 3,
            max_monitored_items_per_client: 5,
            ..Quotas::default()
        },
        0,
    );
    let a = account(&b, 1);
    a.set_client("uri:urn:rogue");
    for _ in 0..3 {
        assert_eq!(a.reserve_item(), Ok(()));
    }
    assert_eq!(a.reserve_item(), Err(StatusCode::BadTooManyMonitoredItems));
    assert_eq!(a.items(), 3);
    assert_eq!(b.over_count(Quota::MonitoredItemsPerSession), 1);
    // A second session of the same client: two more, then the client's
    // quota.
    let a2 = account(&b, 2);
    a2.set_client("uri:urn:rogue");
    assert_eq!(a2.reserve_item(), Ok(()));
    assert_eq!(a2.reserve_item(), Ok(()));
    assert_eq!(a2.reserve_item(), Err(StatusCode::BadTooManyMonitoredItems));
    assert_eq!(a2.items(), 2, "a refused item leaves no reservation");
    assert_eq!(b.over_count(Quota::MonitoredItemsPerClient), 1);
    // Another client is not affected.
    let other = account(&b, 3);
    other.set_client("cert:00ff");
    assert_eq!(other.reserve_item(), Ok(()));
    // Deleting one of the client's items makes room for one.
    a.release_items(1);
    assert_eq!(a2.reserve_item(), Ok(()));
    assert_eq!(a2.reserve_item(), Err(StatusCode::BadTooManyMonitoredItems));
    // A session gone returns its items to its client.
    drop(a);
    let a3 = account(&b, 4);
    a3.set_client("uri:urn:rogue");
    assert_eq!(a3.reserve_item(), Ok(()));
    assert_eq!(a3.reserve_item(), Ok(()));
}

#[test]
fn a_session_of_no_known_client_is_a_client_of_its_own() {
    let b = budget(
        Quotas {
            max_monitored_items_per_session: 0,
            max_monitored_items_per_client: 2,
            ..Quotas::default()
        },
        0,
    );
    let a = account(&b, 1);
    assert_eq!(a.reserve_item(), Ok(()));
    assert_eq!(a.reserve_item(), Ok(()));
    assert_eq!(a.reserve_item(), Err(StatusCode::BadTooManyMonitoredItems));
    // Items adopted before the client is known count for it once it is.
    let c = account(&b, 2);
    c.adopt_items(2);
    c.set_client("uri:x");
    let d = account(&b, 3);
    d.set_client("uri:x");
    assert_eq!(d.reserve_item(), Err(StatusCode::BadTooManyMonitoredItems));
}

#[derive(Clone, Debug)]
struct Blob(u64);

impl KeptSize for Blob {
    const STAGE: Stage = Stage::Queued;
    fn kept_size(&self) -> u64 {
        self.0
    }
}

#[test]
fn every_way_out_of_a_kept_queue_is_counted() {
    let b = budget(Quotas::default(), 0);
    let a = account(&b, 1);
    let mut q = KeptQueue::new();
    q.push_back(Blob(100));
    // Unbound, it counts nowhere; bound, what it holds moves over.
    assert_eq!(a.bytes(Stage::Queued), 0);
    q.bind(&a);
    assert_eq!(a.bytes(Stage::Queued), 100);
    for n in [200, 300, 400] {
        q.push_back(Blob(n));
    }
    assert_eq!(a.bytes(Stage::Queued), 1000);
    assert_eq!(q.pop_front().map(|b| b.0), Some(100));
    assert_eq!(q.remove(1).map(|b| b.0), Some(300));
    assert_eq!(a.bytes(Stage::Queued), 600);
    let taken = q.take_front(1);
    assert_eq!(taken.len(), 1);
    assert_eq!(a.bytes(Stage::Queued), 400);
    let copy = q.clone();
    assert_eq!(a.bytes(Stage::Queued), 800, "a copy holds as much again");
    drop(copy);
    // Moving to another session's account moves the bytes.
    let other = account(&b, 2);
    q.bind(&other);
    assert_eq!(
        (a.bytes(Stage::Queued), other.bytes(Stage::Queued)),
        (0, 400)
    );
    assert_eq!(b.active_sessions(), 1);
    drop(q);
    assert_eq!(other.bytes(Stage::Queued), 0);
    assert_eq!(b.active_sessions(), 0);
    assert_eq!(b.kept(Stage::Queued), 0);
}

#[test]
fn the_totals_move_in_steps_and_settle_at_zero() {
    let b = budget(Quotas::default(), 0);
    let a = account(&b, 1);
    a.add(Stage::Retransmission, SYNC_STEP - 1);
    assert_eq!(
        b.kept(Stage::Retransmission),
        0,
        "under one step: not told yet"
    );
    a.add(Stage::Retransmission, 1);
    assert_eq!(b.kept(Stage::Retransmission), SYNC_STEP);
    a.add(Stage::Retransmission, 10 * SYNC_STEP);
    assert_eq!(b.kept(Stage::Retransmission), 11 * SYNC_STEP);
    a.sub(Stage::Retransmission, 11 * SYNC_STEP);
    assert_eq!(b.kept(Stage::Retransmission), 0);
    a.add(Stage::Retransmission, 5 * SYNC_STEP);
    drop(a);
    assert_eq!(
        b.kept(Stage::Retransmission),
        0,
        "a session gone takes its bytes along"
    );
}

#[test]
fn near_the_budget_only_the_sessions_over_their_share_must_shed() {
    // A budget of 100 steps, two sessions keeping: a share of 50 steps.
    let b = budget(Quotas::default(), 100 * SYNC_STEP);
    let rogue = account(&b, 1);
    let victim = account(&b, 2);
    victim.add(Stage::Queued, 10 * SYNC_STEP);
    rogue.add(Stage::Queued, 75 * SYNC_STEP);
    assert!(!b.near(), "85 of 100: not yet near");
    assert!(
        !rogue.must_shed(Stage::Queued),
        "over its share, but far from the budget"
    );
    rogue.add(Stage::Queued, 10 * SYNC_STEP);
    assert!(b.near());
    assert_eq!(b.fair_share(), 50 * SYNC_STEP);
    assert!(rogue.must_shed(Stage::Queued));
    assert!(
        rogue.must_shed(Stage::Retransmission),
        "the share is of all it keeps"
    );
    assert!(!victim.must_shed(Stage::Queued));
    assert_eq!(b.over_count(Quota::BudgetShare), 2);
    assert_eq!(
        b.take_last_over().map(|(s, _)| s),
        Some(NodeId::numeric(1, 1))
    );
}

#[test]
fn the_byte_quotas_hold_without_a_budget() {
    let b = budget(
        Quotas {
            max_queued_notification_bytes_per_session: 1000,
            max_retransmission_bytes_per_session: 500,
            ..Quotas::default()
        },
        0,
    );
    let a = account(&b, 1);
    a.add(Stage::Queued, 1000);
    assert!(!a.must_shed(Stage::Queued), "at the quota");
    a.add(Stage::Queued, 1);
    assert!(a.must_shed(Stage::Queued), "over it");
    assert!(!a.must_shed(Stage::Retransmission));
    a.add(Stage::Retransmission, 501);
    assert!(a.must_shed(Stage::Retransmission));
    assert_eq!(b.over_count(Quota::QueuedBytesPerSession), 1);
    assert_eq!(b.over_count(Quota::RetransmissionBytesPerSession), 1);
}
