//! `emp wire`: the cluster key that authenticates every frame on the wire
//! (`[cluster] auth`, docs/cluster.md): make one, and rotate it on a
//! running cluster without losing a frame.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use emp_config::WireKey;

use crate::hosts::{load, run_on_every_host, text, FileArgs};

#[derive(Subcommand, Debug)]
pub enum WireCmd {
    /// Make a cluster key file (32 random bytes and a key id, mode 0600).
    Keygen {
        /// The key file to write.
        #[arg(long)]
        out: PathBuf,
        /// Key id [default: 1].
        #[arg(long, conflicts_with = "next")]
        id: Option<u32>,
        /// Replace `--out` with a new key whose id is one more than its
        /// own (the first step of a rotation; then `emp wire rekey`).
        #[arg(long)]
        next: bool,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Rotate the running cluster to the key now in its key file: every
    /// daemon first accepts the new key, then every daemon sends with it;
    /// the old key stays accepted for a grace period (10 s), so frames in
    /// flight are not lost.
    Rekey {
        /// Cluster file (every host, through its `launch`).
        #[arg(long)]
        config: PathBuf,
        /// Only this host, here.
        #[arg(long)]
        host: Option<String>,
        /// With --host: one step only [default: both].
        #[arg(long, value_enum, requires = "host")]
        step: Option<Step>,
        /// Path of `emp` on the hosts [default: this emp].
        #[arg(long)]
        emp: Option<PathBuf>,
    },
}

/// A step of a rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Step {
    /// Reread the key file; accept its key.
    Install,
    /// Send with the installed key.
    Switch,
}

impl Step {
    fn as_str(self) -> &'static str {
        match self {
            Step::Install => "install",
            Step::Switch => "switch",
        }
    }
}

pub fn run(cmd: WireCmd) -> Result<(), String> {
    match cmd {
        WireCmd::Keygen { out, id, next, force } => keygen(&out, id, next, force),
        WireCmd::Rekey { config, host, step, emp } => {
            let a = FileArgs { config, host, emp, ..Default::default() };
            match &a.host {
                Some(h) => rekey_here(&a, h, step),
                None => rekey_everywhere(&a),
            }
        }
    }
}

fn keygen(out: &std::path::Path, id: Option<u32>, next: bool, force: bool) -> Result<(), String> {
    let id = if next {
        let old = WireKey::load(out).map_err(|e| e.to_string())?;
        old.id.checked_add(1).ok_or_else(|| format!("{}: key id {} is the last one", out.display(), old.id))?
    } else {
        id.unwrap_or(1)
    };
    let key = WireKey::generate(id).map_err(|e| e.to_string())?;
    key.save(out, force || next).map_err(|e| e.to_string())?;
    println!("wrote {} (key id {id}, mode 0600)", out.display());
    Ok(())
}

fn state(a: &emp::WireAuth) -> String {
    let mut s = format!("{} sending with key {}", a.mode, a.key_id);
    if a.next_key_id != 0 {
        s += &format!(", key {} accepted", a.next_key_id);
    }
    if a.previous_key_id != 0 {
        s += &format!(", key {} still accepted", a.previous_key_id);
    }
    s
}

/// One host's daemon (each host runs one): its first NIC that answers.
fn rekey_here(a: &FileArgs, host: &str, step: Option<Step>) -> Result<(), String> {
    let (cfg, path) = load(a)?;
    if cfg.auth == emp_config::AuthMode::Off {
        return Err(format!("{}: the cluster does not authenticate its wire (`[cluster] auth`)", path.display()));
    }
    let socks: Vec<String> =
        cfg.nodes_on(host).filter_map(|n| cfg.socket(n.id)).map(|s| s.to_string_lossy().into_owned()).collect();
    let sock = socks
        .iter()
        .find(|s| emp::nic_wire_info(s).is_ok())
        .ok_or_else(|| format!("host {host}: no NIC answers (is the cluster up?)"))?;
    let steps = match step {
        Some(s) => vec![s],
        None => vec![Step::Install, Step::Switch],
    };
    for s in steps {
        let r = emp::nic_wire_rekey(sock, s == Step::Switch).map_err(|e| match e {
            emp::Error::Nic { errno: 22, .. } => format!(
                "host {host}: the daemon refused its key file {} (its log says why; it keeps its keys)",
                cfg.auth_key.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            ),
            e => format!("host {host}: {}: {e}", s.as_str()),
        })?;
        println!("host {host}: {}: {}", s.as_str(), state(&r));
    }
    Ok(())
}

/// Every host accepts the new key before any sends with it.
fn rekey_everywhere(a: &FileArgs) -> Result<(), String> {
    let (cfg, path) = load(a)?;
    if cfg.auth == emp_config::AuthMode::Off {
        return Err(format!("{}: the cluster does not authenticate its wire (`[cluster] auth`)", path.display()));
    }
    if let Some(k) = cfg.auth_key.as_deref().filter(|k| k.exists()) {
        // The copy here: a bad file is better refused before any host is asked.
        WireKey::load(k).map_err(|e| e.to_string())?;
    }
    for step in [Step::Install, Step::Switch] {
        let cmd = vec!["wire".into(), "rekey".into(), "--step".into(), step.as_str().into()];
        let mut failed = Vec::new();
        for (name, o) in run_on_every_host(a.emp.as_deref(), &cfg, &path, &cmd)? {
            let out = text(&o.stdout);
            if !out.is_empty() {
                println!("{out}");
            }
            if !o.status.success() {
                let err = text(&o.stderr);
                println!("host {name}: {}", err.strip_prefix("emp: ").unwrap_or(&err));
                failed.push(name);
            }
        }
        if !failed.is_empty() {
            let what = match step {
                Step::Install => "nothing was switched: every host still sends with the old key",
                Step::Switch => "those hosts still send with the old key, accepted for the grace period only",
            };
            return Err(format!("{} failed on host {}: {what}", step.as_str(), failed.join(", ")));
        }
    }
    Ok(())
}
