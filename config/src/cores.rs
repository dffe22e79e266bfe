//! Host cores for the emulated NIC: `emp-nicd --nic-cores 1` keeps the
//! daemon's threads (the NIC's processors) on core 1, as a real NIC has
//! processors of its own, and `emp bench mpi --nic-cores 1` runs EMP's
//! ranks on the other cores.

/// Most cores a list may name (the kernel's `cpu_set_t`).
const CORES_MAX: usize = libc::CPU_SETSIZE as usize;

/// Parses a core list: numbers and ranges, comma separated (`1`, `0,2`,
/// `2-3,6`), as `taskset -c` takes them; ascending, without repeats.
///
/// # Errors
/// An empty list, a malformed entry, a range backwards, or a core beyond
/// the kernel's set (1024).
pub fn parse(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let num = |t: &str| -> Result<usize, String> {
            let n: usize = t.trim().parse().map_err(|_| format!("core list {s:?}: {t:?} is not a core number"))?;
            if n >= CORES_MAX {
                return Err(format!("core list {s:?}: core {n} is beyond the kernel's {CORES_MAX}"));
            }
            Ok(n)
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(part)?, num(part)?),
        };
        if lo > hi {
            return Err(format!("core list {s:?}: range {part:?} runs backwards"));
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// `cores` as the kernel's set (for `sched_setaffinity`, e.g. in a child
/// before `exec`, where nothing may allocate); cores beyond the set are
/// left out.
pub fn set_of(cores: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain bits; all zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    for &c in cores.iter().filter(|&&c| c < CORES_MAX) {
        // SAFETY: `c` < CPU_SETSIZE (filtered), inside the set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// The cores this process may run on.
///
/// # Errors
/// The kernel's refusal of `sched_getaffinity`.
pub fn allowed() -> std::io::Result<Vec<usize>> {
    // SAFETY: as in `set_of`.
    let mut set: libc::cpu_set_t = unsafe { core::mem::zeroed() };
    // SAFETY: the calling thread's mask into a live set of its own size.
    if unsafe { libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: reading bits of a set the kernel filled, indices in range.
    Ok((0..CORES_MAX).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

/// Keeps the calling thread, and every thread it starts afterwards, on
/// `cores`, which must all be cores this process may use now.
///
/// # Errors
/// A core outside [`allowed`] (said with the allowed ones), or the
/// kernel's refusal.
pub fn pin(cores: &[usize]) -> Result<(), String> {
    let ok = allowed().map_err(|e| format!("sched_getaffinity: {e}"))?;
    if let Some(c) = cores.iter().find(|c| !ok.contains(c)) {
        return Err(format!("core {c} is not one this process may run on (it may use {})", show(&ok)));
    }
    if cores.is_empty() {
        return Err("no core given".into());
    }
    let set = set_of(cores);
    // SAFETY: the calling thread, a live set of its own size.
    if unsafe { libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(format!("sched_setaffinity: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// `cores` as a list `parse` reads back (`0,2-3`).
pub fn show(cores: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { cores[i].to_string() } else { format!("{}-{}", cores[i], cores[j]) });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_taskset_reads_them() {
        assert_eq!(parse("1").unwrap(), vec![1]);
        assert_eq!(parse("3,0-1, 1").unwrap(), vec![0, 1, 3]);
        assert_eq!(show(&parse("6,2-3,5").unwrap()), "2-3,5-6");
        for bad in ["", "a", "1-", "3-1", "1,,2", "1024", "-1"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn pinning_refuses_a_core_this_process_may_not_use_and_keeps_its_mask() {
        let before = allowed().unwrap();
        let outside = (0..CORES_MAX).find(|c| !before.contains(c)).unwrap();
        let e = pin(&[outside]).unwrap_err();
        assert!(e.contains(&format!("core {outside}")), "{e}");
        assert!(pin(&[]).is_err());
        assert_eq!(allowed().unwrap(), before);
        // On a thread of its own, so the test harness keeps its mask.
        let first = before[0];
        let got = std::thread::spawn(move || pin(&[first]).and_then(|()| allowed().map_err(|e| e.to_string())))
            .join()
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![first]);
    }
}
