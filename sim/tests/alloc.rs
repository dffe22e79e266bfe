//! No heap allocation per frame on the point-to-point steady-state path.
//! A counting global allocator counts the allocations made while the
//! firmware's own code runs on this thread (`world::inside_firmware`:
//! inside a `Nic` handler, outside the simulated hardware it calls back).
//! After a warm-up that sizes every queue the workload needs, streaming
//! more of the same must allocate nothing in the firmware.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::Pair;
use emp_firmware::{Config, FlowControl};
use emp_sim::world::inside_firmware;
use emp_uapi::desc::Status;
use emp_uapi::image::cpu_plan;
use emp_uapi::sram::counter;
use emp_uapi::wire::{Frame, FrameKind};

thread_local! {
    /// Allocations made inside the firmware on this thread (each test runs
    /// its simulation on its own thread).
    static FIRMWARE_ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note_alloc() {
    if inside_firmware() {
        let _ = FIRMWARE_ALLOCS.try_with(|c| c.set(c.get() + 1));
    }
}

fn firmware_allocs() -> u64 {
    FIRMWARE_ALLOCS.with(Cell::get)
}

/// The system allocator, counting.
struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments, so
// `System`'s guarantees hold; counting only touches thread-locals that are
// const-initialised `Cell`s without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: our caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: `ptr` came from this allocator, that is from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Message sizes streamed each round, both ways: empty, one frame, a few
/// groups, more than a window (1500-byte MTU: 48 frames ≈ 70 kB).
const SIZES: [u64; 6] = [0, 64, 1400, 10_000, 70_000, 200_000];
/// Where node buffers start: sends below, receives above.
const RECV_BASE: u64 = 2 << 20;

/// One round: every size both ways with the receives posted first, plus
/// one message whose receive is posted late (the receiver retains its
/// header and pulls it on posting, or under ordered refusal refuses it
/// until then: not-ready NACKs, the kick on posting, the resend); all complete.
fn round(p: &mut Pair, tag: u64) {
    let mut expected = [0u32; 2];
    for n in 0..2u16 {
        let mut at = 0;
        for (i, &len) in SIZES.iter().enumerate() {
            p.recv(1 - n, tag + i as u64, RECV_BASE + at, len);
            p.send(n, tag + i as u64, at, len);
            at += len + 64;
        }
        expected[n as usize] += 2 * SIZES.len() as u32;
    }
    let late = tag + SIZES.len() as u64;
    p.send(0, late, 0, 3000);
    let until = p.world.now + 300_000;
    while p.world.now < until && p.step() {}
    p.recv(1, late, RECV_BASE + (1 << 20), 3000);
    expected[0] += 1;
    expected[1] += 1;
    for n in 0..2u16 {
        while expected[n as usize] > 0 {
            match p.poll(n) {
                Some(c) => {
                    assert_eq!(Status::from_u8(c.status), Some(Status::Success), "node {n}: {c:?}");
                    expected[n as usize] -= 1;
                }
                None => assert!(p.step(), "node {n} waits for {} completions", expected[n as usize]),
            }
        }
    }
}

/// Streams `warm` rounds, then `measured` rounds; returns the firmware's
/// allocations during the warm-up and during the measured rounds.
fn allocations(p: &mut Pair, warm: u64, measured: u64) -> (u64, u64) {
    let before = firmware_allocs();
    for r in 0..warm {
        round(p, r * 16);
    }
    let warm_allocs = firmware_allocs() - before;
    let frames = p.counter(0, counter::TX_FRAMES);
    let before = firmware_allocs();
    for r in warm..warm + measured {
        round(p, r * 16);
    }
    let sent = p.counter(0, counter::TX_FRAMES) - frames;
    assert!(sent > measured * 150, "the measured rounds sent only {sent} frames");
    // Refused (ordered refusal) or retained and pulled (unexpected mode).
    let late = p.counter(1, counter::DROPPED_UNEXPECTED) + p.counter(1, counter::RDV_PULLS);
    assert!(late > 0, "the late receives' messages were unexpected first");
    (warm_allocs, firmware_allocs() - before)
}

fn pair(cfg: Config) -> Pair {
    Pair::new(cfg, 1500, [4 << 20, 4 << 20])
}

#[test]
fn test_steady_stream_allocates_nothing_in_the_firmware() {
    let mut p = pair(Config::default());
    let (warm, measured) = allocations(&mut p, 10, 30);
    assert!(warm > 0, "the counter sees the firmware's allocations (its queues grow during the warm-up)");
    assert_eq!(measured, 0, "allocations inside the firmware after the warm-up");
}

#[test]
fn test_steady_stream_on_two_nic_cpus_allocates_nothing() {
    // Receiving runs on CPU B: each payload waits in a queue for its DMA.
    for plan in [cpu_plan::RO, cpu_plan::DSR] {
        let mut p = pair(Config { cpu_plan: plan, ..Config::default() });
        let (_, measured) = allocations(&mut p, 10, 30);
        assert_eq!(measured, 0, "plan {plan}: allocations inside the firmware after the warm-up");
    }
}

#[test]
fn test_steady_stream_under_ordered_refusal_allocates_nothing() {
    let mut p = pair(Config { matching: emp_firmware::MatchMode::OrderedRefusal, ..Config::default() });
    let (_, measured) = allocations(&mut p, 10, 30);
    assert!(p.counter(1, counter::DROPPED_UNEXPECTED) > 0, "the late receives were refused first");
    assert_eq!(measured, 0, "allocations inside the firmware after the warm-up");
}

#[test]
fn test_steady_stream_with_modified_ack_nack_allocates_nothing() {
    // Refusals rewind the later messages of the refused one's sender.
    let mut p = pair(Config { flow_control: FlowControl::ModifiedAckNack, ..Config::default() });
    let (_, measured) = allocations(&mut p, 10, 30);
    assert_eq!(measured, 0, "allocations inside the firmware after the warm-up");
}

#[test]
fn test_steady_stream_with_losses_allocates_nothing() {
    // Every 61st DATA frame is lost: NACKs, fast resends and timeouts.
    let mut p = pair(Config::default());
    let mut n = 0u64;
    p.world.drop_filter = Some(Box::new(move |_, _, bytes: &[u8]| {
        let data = matches!(Frame::parse(bytes), Ok(Frame::Data { hdr, .. }) if hdr.kind == FrameKind::Data as u8);
        n += data as u64;
        data && n % 61 == 0
    }));
    let (_, measured) = allocations(&mut p, 10, 30);
    assert!(p.counter(0, counter::RETRANSMITS) > 0);
    assert_eq!(measured, 0, "allocations inside the firmware after the warm-up");
}
