//! Persistent descriptors through libemp on the chassis: a send and a
//! receive stored once, started again and again, deliver each round's
//! bytes under the start's wr_id; bad slots are refused before anything
//! is posted, an empty slot's start completes as a bad descriptor.

use std::time::Duration;

use emp::{Device, Error, Opcode, Status, PERSIST_SLOTS};
use emp_tests::harness::Cluster;

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

#[test]
fn stored_send_and_receive_run_at_every_start() {
    let c = Cluster::up("persist", &["-n", "2"]);
    let (mut a, mut b) = (Device::open_path(&c.sock(0)).unwrap(), Device::open_path(&c.sock(1)).unwrap());
    let (mut src, dst) = (a.alloc(4096).unwrap(), b.alloc(4096).unwrap());
    let (sa, sb) = (PERSIST_SLOTS as u8 - 1, 2);
    a.send_init(sa, b.endpoint(), 42, &[src.sge(0, 1000), src.sge(2000, 2000)]).unwrap();
    b.recv_init(sb, a.endpoint(), 42, 0, &[dst.sge(0, 4096)]).unwrap();
    for round in 0..50u64 {
        let bytes: Vec<u8> = (0..4096).map(|i| (i as u64 * 7 + round * 31) as u8).collect();
        src.as_mut_slice().copy_from_slice(&bytes);
        b.start_recv(1000 + round, sb).unwrap();
        a.start_send(2000 + round, sa).unwrap();
        let r = b.wait_wr(1000 + round, WAIT).unwrap();
        assert_eq!((r.status, r.opcode, r.tag, r.byte_len), (Status::Success, Opcode::Recv, 42, 3000), "round {round}");
        let want: Vec<u8> = bytes[..1000].iter().chain(&bytes[2000..4000]).copied().collect();
        assert_eq!(&dst.as_slice()[..3000], &want[..], "round {round}: the buffer's bytes of the moment");
        let s = a.wait_wr(2000 + round, WAIT).unwrap();
        assert_eq!((s.status, s.opcode), (Status::Success, Opcode::Send));
    }
    // Slots out of range never reach the ring.
    for e in [a.start_send(1, PERSIST_SLOTS as u8).unwrap_err(), a.send_init(200, b.endpoint(), 1, &[]).unwrap_err()] {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
    // A start of an empty slot completes as a bad descriptor.
    a.start_send(7, 0).unwrap();
    let bad = a.wait_wr(7, WAIT).unwrap();
    assert_eq!((bad.status, bad.opcode), (Status::BadDescriptor, Opcode::Start));
}
