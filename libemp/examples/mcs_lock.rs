//! A distributed MCS queue lock on NIC remote atomics, protecting a
//! counter at rank 0 that is updated by a plain (non-atomic) read, then
//! write: `emp run -n 4 -- target/release/examples/mcs_lock [rounds]`.
//!
//! Each round a rank takes the lock (one remote swap on the lock's tail
//! word at rank 0, plus one to link behind its predecessor), reads the
//! counter (fetch-add of 0), writes it back plus one (swap), and releases
//! (a compare-and-swap on the tail, or one remote write that wakes the
//! next rank, which was polling a word in its own memory). Rank 0 checks
//! that no update was lost. The lock's home host does none of this work:
//! its NIC does.

use std::time::Instant;

use emp::mcs::McsLock;
use emp::rdv::Job;
use emp::Device;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: u64 = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(100);
    let job = Job::from_env()?;
    let mut dev = Device::open()?;
    let mut lock = McsLock::create(&mut dev, &job, "example", 0)?;
    let (home, counter) = lock.user_word(0, 0);
    job.barrier(&mut dev, "start")?;
    let t0 = Instant::now();
    for _ in 0..rounds {
        lock.acquire(&mut dev)?;
        let v = dev.fetch_add(home, counter, 0)?; // read
        dev.swap(home, counter, v + 1)?; // write: safe only under the lock
        lock.release(&mut dev)?;
    }
    let per = t0.elapsed().as_secs_f64() * 1e6 / rounds.max(1) as f64;
    println!("rank {}: {rounds} acquisitions, {per:.1} us per locked update", job.rank);
    job.barrier(&mut dev, "done")?;
    if job.rank == 0 {
        let total = dev.fetch_add(home, counter, 0)?;
        let want = rounds * job.size as u64;
        println!("counter = {total} (expected {want})");
        if total != want {
            eprintln!("mcs_lock: {} updates lost", want.saturating_sub(total));
            std::process::exit(1);
        }
    }
    // Let the other ranks read their last answers before rank 0's port goes.
    job.barrier(&mut dev, "exit")?;
    Ok(())
}
