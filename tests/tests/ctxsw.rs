//! Port context switch on the chassis (docs/context-switch.md): two ranks
//! on two `emp-nicd` NICs (mem wire) stream messages while the receiver,
//! then the sender, is suspended, saved into its own memory, and restored —
//! the receiver into another slot, because a third process took its old
//! one meanwhile. Every message arrives once, in order, with its bytes; the
//! process in the old slot gets none of them; a corrupted image is refused
//! and the intact one then restores.

use std::time::{Duration, Instant};

use emp::{Completion, Device, Endpoint, Error, Status};
use emp_tests::harness::Cluster;

const MSGS: u64 = 300;
const MAX_LEN: usize = 20_000;

fn len_of(i: u64) -> usize {
    1 + (i as usize * 7919) % MAX_LEN
}

fn byte(i: u64, at: usize) -> u8 {
    (at as u64).wrapping_mul(31).wrapping_add(i * 7) as u8
}

/// Suspends `d` and waits (bounded) until it is stable.
fn suspend_until_stable(d: &mut Device) {
    d.suspend().expect("suspend");
    let end = Instant::now() + Duration::from_secs(20);
    while !d.is_stable().expect("is_stable") {
        assert!(Instant::now() < end, "the port never became stable");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn a_live_port_is_switched_out_and_back_mid_stream() {
    let c = Cluster::up("ctxsw", &["-n", "2"]);
    let mut a = Device::open_path(&c.sock(0)).expect("rank 0");
    let mut b = Device::open_path(&c.sock(1)).expect("rank 1");
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut src = a.alloc(MAX_LEN * 8).unwrap();
    let dst = b.alloc(MAX_LEN * 8).unwrap();
    let image_a = a.alloc(1 << 20).unwrap();
    let mut image_b = b.alloc(1 << 20).unwrap();
    let mut wc = [Completion::default(); 16];
    let (mut sent, mut posted, mut received, mut send_done) = (0u64, 0u64, 0u64, 0u64);
    // Eight buffers each side, reused round robin: message i in slot i % 8.
    let mut switched = (false, false);
    let end = Instant::now() + Duration::from_secs(120);
    while received < MSGS || send_done < MSGS {
        assert!(Instant::now() < end, "stream stalled: {sent} sent, {send_done} done, {received} received");
        while posted < MSGS && posted < received + 8 {
            let at = (posted % 8) as usize * MAX_LEN;
            // Any tag: the i-th receive must take the i-th message.
            b.post_recv(posted, ea, 0, u64::MAX, &[dst.sge(at, MAX_LEN)]).unwrap();
            posted += 1;
        }
        while sent < MSGS && sent < send_done + 8 {
            let at = (sent % 8) as usize * MAX_LEN;
            let len = len_of(sent);
            for (k, x) in src.as_mut_slice()[at..at + len].iter_mut().enumerate() {
                *x = byte(sent, k);
            }
            a.post_send(sent, eb, sent, &[src.sge(at, len)]).unwrap();
            sent += 1;
        }
        let n = a.poll_cq(&mut wc);
        for cqe in &wc[..n] {
            assert_eq!((cqe.status, cqe.wr_id), (Status::Success, send_done), "sends complete in order");
            send_done += 1;
        }
        let n = b.poll_cq(&mut wc);
        for cqe in &wc[..n] {
            let i = received;
            assert_eq!((cqe.status, cqe.wr_id, cqe.tag), (Status::Success, i, i), "receive {i}");
            assert_eq!(cqe.byte_len as usize, len_of(i));
            let at = (i % 8) as usize * MAX_LEN;
            let got = &dst.as_slice()[at..at + len_of(i)];
            assert!(got.iter().enumerate().all(|(k, &x)| x == byte(i, k)), "bytes of message {i}");
            received += 1;
        }
        if received >= MSGS / 3 && !switched.0 {
            switched.0 = true;
            switch_receiver(&c, &mut b, &mut image_b, ea);
        }
        if received >= 2 * MSGS / 3 && !switched.1 {
            switched.1 = true;
            suspend_until_stable(&mut a);
            let len = a.save(&image_a).expect("save the sender");
            assert!(matches!(a.post_send(0, eb, 0, &[src.sge(0, 1)]), Err(Error::InvalidArgument(_))));
            std::thread::sleep(Duration::from_millis(20));
            a.restore(&image_a, len).expect("restore the sender");
            a.resume().expect("resume the sender");
        }
    }
    assert_eq!(a.endpoint(), ea);
    assert_eq!(b.endpoint(), eb, "a restored port keeps its endpoint");
}

/// Switches the receiver out while the sender keeps sending: a third
/// process opens in the freed slot (and must receive nothing); a corrupted
/// image is refused; the intact one restores into another slot.
fn switch_receiver(c: &Cluster, b: &mut Device, image: &mut emp::Buffer, from: Endpoint) {
    suspend_until_stable(b);
    let len = b.save(image).expect("save the receiver");
    let mut other = Device::open_path(&c.sock(1)).expect("another process takes the freed slot");
    let buf = other.alloc(4096).unwrap();
    for i in 0..4 {
        other.post_recv(1000 + i, from, 0, u64::MAX, &[buf.sge(0, 4096)]).unwrap();
    }
    // The sender's messages to the saved port are refused and retried meanwhile.
    std::thread::sleep(Duration::from_millis(50));
    let good = image.as_slice()[..len as usize].to_vec();
    image.as_mut_slice()[40] ^= 0x10;
    match b.restore(image, len) {
        Err(Error::Nic { errno, .. }) => assert_eq!(errno, libc::EBADMSG),
        r => panic!("a corrupted image restored: {r:?}"),
    }
    image.as_mut_slice()[..len as usize].copy_from_slice(&good);
    b.restore(image, len).expect("restore the receiver");
    b.resume().expect("resume the receiver");
    std::thread::sleep(Duration::from_millis(20));
    let mut wc = [Completion::default(); 4];
    assert_eq!(other.poll_cq(&mut wc), 0, "the process in the old slot received another job's message");
}
