//! Remote keys under attack: a peer that guesses keys finds none within a
//! bounded number of tries, the target counts every refusal (in its
//! counters and in the port's control page) and throttles the guesser
//! while other peers keep working. Named `test_<situation>_<event>`.

use emp_firmware::Config;
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{MrEntry, Opcode, Status, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC};
use emp_uapi::sram::{counter, ctl};

const MS: u64 = 1_000_000;
const ATOMIC_RW: u8 = MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_ATOMIC;

/// The attack of issue 12: fetch-add(+1) with candidate keys. Before the
/// secret, scanning the 15 generated bits above a known slot found the
/// live key within 32768 tries; here the guesser scans a stretch of those
/// bits that contains the right ones, with secrets it must guess.
const TRIES: u32 = 3000;

fn port_ctl(c: &Cluster, n: u16, off: usize) -> u32 {
    let at = c.world.layout.port(0).ctl(off);
    u32::from_le_bytes(c.world.nodes[n as usize].sram[at..at + 4].try_into().unwrap())
}

/// Fetch-add(+1) from `n` on node 0's word; the completion's status.
fn try_key(c: &mut Cluster, n: u16, key: u32, secret: u32) -> Status {
    let wr = c.atomic_with_secret(n, Opcode::AtomicFetchAdd, 0, (key, 0, 8), secret, 1, 0);
    let cqe = c.wait(n, wr, 10_000 * MS).expect("every try completes");
    Status::from_u8(cqe.status).unwrap()
}

#[test]
fn test_key_guesser_finds_nothing_and_is_throttled() {
    let mut c = Cluster::new(3, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let secret = c.secret(0, key);
    let (slot, high) = (MrEntry::slot_of(key) as u32, key >> 16);
    // A guesser's stream of secrets (a fixed LCG: any stream it could pick).
    let mut guess = 0x9E37_79B9u32;
    let mut found = 0;
    for i in 0..TRIES {
        let h = ((high + i) % 0x8000) | 1; // covers `high` at i = 0
        guess = guess.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
        let g = if guess == secret { guess ^ 1 } else { guess };
        if try_key(&mut c, 1, h << 16 | slot, g) == Status::Success {
            found += 1;
        }
    }
    assert_eq!(found, 0, "a guess without the secret reached the region");
    assert_eq!(c.read_word(0, key, 0, 8), 0, "the target word is untouched");
    let (refused, throttled) = (c.counter(0, counter::REMOTE_REFUSED), c.counter(0, counter::REMOTE_THROTTLED));
    assert_eq!(refused, TRIES as u64, "every try is counted");
    let max = Config::default().remote_refusals_max as u64;
    assert!(throttled >= TRIES as u64 - 2 * max, "the guesser was throttled: {throttled} of {refused}");
    assert_eq!(port_ctl(&c, 0, ctl::REMOTE_REFUSED) as u64, refused, "the port's own count");
    assert_eq!(port_ctl(&c, 0, ctl::REMOTE_THROTTLED) as u64, throttled);

    // The right key and secret: refused too while the guesser is throttled…
    assert_eq!(try_key(&mut c, 1, key, secret), Status::RemoteAccessError, "throttled source");
    // …while another peer is not affected.
    assert_eq!(try_key(&mut c, 2, key, secret), Status::Success);
    // The throttle ends: the guesser's node is served again.
    c.run_for(Config::default().remote_throttle_ns + MS);
    assert_eq!(try_key(&mut c, 1, key, secret), Status::Success);
    assert_eq!(c.read_word(0, key, 0, 8), 2, "exactly the two genuine adds");
    for node in &c.world.nodes {
        node.nic.invariants().unwrap();
    }
}

#[test]
fn test_wrong_secret_alone_is_refused_and_counted() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let secret = c.secret(0, key);
    assert_ne!(secret, 0, "a registration always has a secret");
    for bad in [0, secret ^ 1, secret ^ 0x8000_0000, !secret] {
        assert_eq!(try_key(&mut c, 1, key, bad), Status::RemoteAccessError, "secret {bad:#x}");
    }
    assert_eq!(c.counter(0, counter::REMOTE_REFUSED), 4);
    assert_eq!(c.counter(0, counter::REMOTE_THROTTLED), 0, "a few refusals do not throttle");
    assert_eq!(try_key(&mut c, 1, key, secret), Status::Success);
    assert_eq!(c.read_word(0, key, 0, 8), 1);
}
