//! The receive side at work (`RecvCpu`, docs/nic-cpus.md) reaches nothing
//! of the send side, by its type. These tests check that it is the one
//! that takes a stream's DATA frames: only what needs the whole program
//! (here, the first frame from a new sender) goes past it.

mod common;

use common::Pair;
use emp_firmware::Config;
use emp_uapi::desc::Status;
use emp_uapi::sram::counter;
use emp_uapi::wire::Frame;

#[test]
fn a_streams_data_frames_are_taken_by_the_receive_side_alone() {
    let mut p = Pair::new(Config::default(), 1500, [1 << 20, 1 << 20]);
    // Every 20th DATA frame is lost: retransmissions, gaps and NACKs too.
    let mut data = 0u32;
    p.world.drop_filter = Some(Box::new(move |_, _, bytes: &[u8]| {
        matches!(Frame::parse(bytes), Ok(Frame::Data { .. })) && {
            data += 1;
            data % 20 == 0
        }
    }));
    const MSGS: u64 = 100;
    for i in 0..MSGS {
        // One-frame and three-frame messages, alternating.
        let len = if i % 2 == 0 { 64 } else { 4000 };
        p.recv(1, i, i * 4096, len);
        p.send(0, i, i * 4096, len);
    }
    let (mut sent, mut got) = (0, 0);
    while sent < MSGS || got < MSGS {
        assert!(p.step(), "the stream stalled at {sent} sent, {got} received");
        while let Some(c) = p.poll(0) {
            assert_eq!(Status::from_u8(c.status), Some(Status::Success));
            sent += 1;
        }
        while let Some(c) = p.poll(1) {
            assert_eq!(Status::from_u8(c.status), Some(Status::Success));
            got += 1;
        }
    }
    assert!(p.counter(0, counter::RETRANSMITS) > 0, "frames were lost and sent again");
    let (alone, whole) = p.world.nodes[1].nic.data_frames();
    assert_eq!(whole, 1, "only the new sender's first frame needs the whole program");
    assert!(alone + whole >= p.counter(1, counter::RX_FRAMES), "every frame taken went one way or the other");
    assert!(alone >= MSGS * 2, "{alone} frames taken alone");
}
