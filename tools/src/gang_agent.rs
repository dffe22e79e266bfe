//! `emp gang-agent --nic SOCKET`: `emp gang --config`'s hands on one host.
//! The scheduler starts one agent per node through the node's host's
//! `launch` prefix (`ip netns exec ns`, `ssh host`) and drives it over the
//! agent's standard input and output, one request line and one reply line
//! at a time (the ranks' standard output goes to the agent's standard
//! error, which the launcher carries back). The agent does on its host what the scheduler cannot do from
//! afar: start a rank (its pid is the agent's child's, in the host's pid
//! namespace, as the node's daemon sees it), signal it, read its state,
//! reap it, and ask the node's daemon for GANG steps on it. When its input
//! ends (the scheduler exited or died) it kills every rank it started.
//!
//! Lines are words separated by single spaces; a word's bytes outside
//! `[A-Za-z0-9._/=:,+@-]` are written `%XX`. Requests and replies:
//!
//! | request | reply |
//! |---|---|
//! | `spawn N K=V… ARGV…` (N environment words) | `ok PID` |
//! | `signal SIG PID` | `ok` |
//! | `state PID` | `ok L` (`/proc`'s state letter, `-` when gone) |
//! | `wait PID` | `ok running` or `ok exited CODE` (128 + signal when killed) |
//! | `kill PID` | `ok` (SIGKILL, then reaped) |
//! | `gang ACTION PID` | `ok ARG0 ARG1`, or `err ERRNO MESSAGE` |
//! | `hello` | `ok` once the node's daemon answered (a count of the agent's own ports) |
//!
//! Any failure is `err ERRNO MESSAGE` (ERRNO 0 when there is none); a PID
//! the agent did not start is refused, so a scheduler can signal nothing
//! but its own ranks.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Encodes one word of a line.
fn word(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"._/=:,+@-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() {
        out.push('%');
    }
    out
}

/// Decodes one word ([`word`]'s inverse; `%` alone is the empty word).
fn unword(w: &str) -> Result<String, String> {
    if w == "%" {
        return Ok(String::new());
    }
    let b = w.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = w.get(i + 1..i + 3).ok_or_else(|| format!("bad escape in {w:?}"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad escape in {w:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{w:?} is not UTF-8"))
}

fn line(words: &[String]) -> String {
    words.iter().map(|w| word(w)).collect::<Vec<_>>().join(" ")
}

fn parse(l: &str) -> Result<Vec<String>, String> {
    l.split(' ').filter(|w| !w.is_empty()).map(unword).collect()
}

/// `/proc`'s state letter of `pid` (`None` once it is gone).
pub(crate) fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

/// A rank's exit code as the scheduler reports it: 128 + signal if killed.
pub(crate) fn exit_code(st: std::process::ExitStatus) -> i32 {
    st.code().unwrap_or(128 + st.signal().unwrap_or(0))
}

/// GANG `action` on `pid`'s ports at the NIC `nic` of this host: the
/// reply's (`arg[0]`, `arg[1]`), or the refusal (errno, or 0, and why).
pub(crate) fn nic_gang(nic: &str, action: u64, pid: u32) -> Result<(u64, u64), Refusal> {
    match emp::nic_gang(nic, action, pid as i32) {
        Ok(m) => Ok((m.arg[0], m.arg[1])),
        Err(emp::Error::Nic { errno, .. }) => Err((errno, format!("the NIC refused (errno {errno})"))),
        Err(e) => Err((0, e.to_string())),
    }
}

/// Runs the agent until its input ends; kills every rank it started then.
pub fn serve(nic: &str) -> Result<i32, String> {
    let mut kids: HashMap<u32, Child> = HashMap::new();
    let stdin = std::io::stdin();
    let mut out = BufWriter::new(std::io::stdout());
    // Until the scheduler is gone: its pipe ends (EOF, or a read or a
    // reply that fails).
    for l in stdin.lock().lines() {
        let Ok(l) = l else { break };
        let reply = match parse(&l).map_err(|e| (libc::EINVAL, e)).and_then(|w| request(nic, &mut kids, &w)) {
            Ok(words) => line(&[vec!["ok".to_owned()], words].concat()),
            Err(e) => line(&["err".into(), e.0.to_string(), e.1]),
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    // SIGKILL ends a stopped rank too; none is left to run without its
    // scheduler (it would find its window serving another job).
    for (_, mut c) in kids.drain() {
        let _ = c.kill();
        let _ = c.wait();
    }
    Ok(0)
}

fn request(nic: &str, kids: &mut HashMap<u32, Child>, w: &[String]) -> Result<Vec<String>, Refusal> {
    let bad = |m: &str| (libc::EINVAL, m.to_owned());
    let num = |i: usize| -> Result<u64, Refusal> {
        w.get(i).and_then(|s| s.parse().ok()).ok_or_else(|| bad(&format!("{}: a number expected", w[0])))
    };
    let own = |kids: &HashMap<u32, Child>, pid: u64| -> Result<u32, Refusal> {
        let pid = u32::try_from(pid).map_err(|_| bad("pid out of range"))?;
        if kids.contains_key(&pid) {
            Ok(pid)
        } else {
            Err((libc::ESRCH, format!("pid {pid} is not a rank this agent started")))
        }
    };
    match w.first().map(String::as_str) {
        Some("spawn") => {
            let n = num(1)? as usize;
            let env = w.get(2..2 + n).ok_or_else(|| bad("spawn: fewer environment words than said"))?;
            let argv = &w[2 + n..];
            if argv.is_empty() {
                return Err(bad("spawn: no program"));
            }
            // The agent's standard output is the scheduler's pipe: a rank's
            // goes to the agent's standard error, which the launcher
            // carries back to the scheduler's.
            let err = std::os::fd::AsFd::as_fd(&std::io::stderr())
                .try_clone_to_owned()
                .map_err(|e| (e.raw_os_error().unwrap_or(0), format!("stderr: {e}")))?;
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(Stdio::from(err));
            for kv in env {
                let (k, v) = kv.split_once('=').ok_or_else(|| bad("spawn: environment word without ="))?;
                cmd.env(k, v);
            }
            let child = cmd.spawn().map_err(|e| (e.raw_os_error().unwrap_or(0), format!("{}: {e}", argv[0])))?;
            let pid = child.id();
            kids.insert(pid, child);
            Ok(vec![pid.to_string()])
        }
        Some("signal") => {
            let sig = i32::try_from(num(1)?).map_err(|_| bad("signal out of range"))?;
            let pid = own(kids, num(2)?)?;
            // SAFETY: kill has no memory preconditions; `pid` is our child, not yet reaped.
            if unsafe { libc::kill(pid as i32, sig) } != 0 {
                let e = std::io::Error::last_os_error();
                return Err((e.raw_os_error().unwrap_or(0), format!("kill {pid}: {e}")));
            }
            Ok(vec![])
        }
        Some("state") => {
            let pid = own(kids, num(1)?)?;
            Ok(vec![proc_state(pid).map_or_else(|| "-".to_owned(), |c| c.to_string())])
        }
        Some("wait") => {
            let pid = own(kids, num(1)?)?;
            let c = kids.get_mut(&pid).expect("owned");
            match c.try_wait() {
                Ok(None) => Ok(vec!["running".into()]),
                Ok(Some(st)) => {
                    kids.remove(&pid);
                    Ok(vec!["exited".into(), exit_code(st).to_string()])
                }
                Err(e) => Err((e.raw_os_error().unwrap_or(0), format!("wait {pid}: {e}"))),
            }
        }
        Some("kill") => {
            let pid = own(kids, num(1)?)?;
            let mut c = kids.remove(&pid).expect("owned");
            let _ = c.kill();
            let _ = c.wait();
            Ok(vec![])
        }
        Some("gang") => {
            let action = num(1)?;
            let pid = own(kids, num(2)?)?;
            let (a0, a1) = nic_gang(nic, action, pid)?;
            Ok(vec![a0.to_string(), a1.to_string()])
        }
        Some("hello") => nic_gang(nic, emp_uapi::attach::gang::PORTS, std::process::id())
            .map(|_| vec![])
            .map_err(|(errno, e)| (errno, format!("the NIC at {nic}: {e}"))),
        _ => Err(bad(&format!("unknown request {:?}", w.first()))),
    }
}

/// The scheduler's end of one agent.
pub(crate) struct Agent {
    child: Child,
    /// Taken (closed) when the agent is dropped.
    to: Option<BufWriter<ChildStdin>>,
    from: BufReader<ChildStdout>,
    /// What the agent was started as, for messages.
    what: String,
}

/// An agent's answer to a request that failed: (errno or 0, message).
pub(crate) type Refusal = (i32, String);

impl Agent {
    /// Starts `emp gang-agent --nic NIC` through `launch` (empty: here).
    pub(crate) fn start(launch: &[String], emp: &str, nic: &str) -> Result<Agent, String> {
        let mut argv: Vec<String> = launch.to_vec();
        argv.extend([emp.to_owned(), "gang-agent".into(), "--nic".into(), nic.to_owned()]);
        let what = argv.join(" ");
        if let Some(w) = argv[launch.len()..].iter().find(|w| !launch.is_empty() && !crate::hosts::shell_safe(w)) {
            return Err(format!("{w:?} would be split by a remote shell ({what}); use plain paths"));
        }
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {what}: {e}"))?;
        let to = Some(BufWriter::new(child.stdin.take().expect("piped")));
        let from = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Agent { child, to, from, what })
    }

    /// One request; the reply's words after `ok`, or the agent's refusal.
    /// A dead agent or a garbled reply is an error of the scheduler's own.
    pub(crate) fn call(&mut self, words: &[String]) -> Result<Result<Vec<String>, Refusal>, String> {
        let dead = |e: String| format!("gang agent ({}): {e}", self.what);
        let to = self.to.as_mut().expect("open until dropped");
        writeln!(to, "{}", line(words)).and_then(|()| to.flush()).map_err(|e| dead(e.to_string()))?;
        let mut l = String::new();
        match self.from.read_line(&mut l) {
            Ok(0) => return Err(dead("it exited".into())),
            Ok(_) => {}
            Err(e) => return Err(dead(e.to_string())),
        }
        let w = parse(l.trim_end_matches('\n')).map_err(dead)?;
        match w.first().map(String::as_str) {
            Some("ok") => Ok(Ok(w[1..].to_vec())),
            Some("err") if w.len() == 3 => Ok(Err((w[1].parse().unwrap_or(0), w[2].clone()))),
            _ => Err(dead(format!("garbled reply {l:?}"))),
        }
    }
}

impl Drop for Agent {
    /// Its input ends: it kills the ranks it started and exits.
    fn drop(&mut self) {
        drop(self.to.take());
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        for s in ["", "plain", "a b", "100%", "x=y z", "é\n\t", "/tmp/a b/c"] {
            let w = word(s);
            assert!(!w.contains(' ') && !w.contains('\n') && !w.is_empty(), "{w:?}");
            assert_eq!(unword(&w).unwrap(), s);
        }
        assert!(unword("%4").is_err() && unword("%zz").is_err());
        assert_eq!(parse(&line(&["a b".into(), "".into(), "c".into()])).unwrap(), ["a b", "", "c"]);
    }
}
