//! Two ports exchange one tagged message: `hello <sock-a> <sock-b>`.
use emp::{Completion, Device, ANY};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (pa, pb) = (&args[1], &args[2]);
    let mut a = Device::open_path(pa)?;
    let mut b = Device::open_path(pb)?;
    println!("a = {}, b = {}", a.endpoint(), b.endpoint());
    let rb = b.alloc(4096)?;
    b.post_recv(7, ANY, 42, 0, &[rb.sge(0, 4096)])?;
    let mut sa = a.alloc(4096)?;
    sa.as_mut_slice()[..5].copy_from_slice(b"hello");
    a.post_send(1, b.endpoint(), 42, &[sa.sge(0, 5)])?;
    let mut wc = [Completion::default(); 4];
    let n = b.wait_cq(&mut wc, Some(Duration::from_secs(5)))?;
    println!("b got {:?}: {:?}", &wc[..n], std::str::from_utf8(&rb.as_slice()[..5]));
    let n = a.wait_cq(&mut wc, Some(Duration::from_secs(5)))?;
    println!("a got {:?}", &wc[..n]);
    Ok(())
}
