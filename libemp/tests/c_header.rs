//! Checks `include/emp.h`, the C face of `libemp.so`, against the Rust side
//! (`src/ffi.rs` and the types it passes through), the way
//! `uapi/tests/c_layout.rs` checks `emp_uapi.h`:
//!
//! - A C program is generated that includes the header and prints the size
//!   of every structure, the offset, size and `<stdint.h>` type of every
//!   field, and the value of every constant (`#define`s and enum members).
//!   It is compiled with the system C compiler (`$CC`, else `cc`, `gcc`,
//!   `clang`; a missing compiler is a failure) and every line is compared
//!   with `size_of`, `offset_of!` and the Rust constants.
//! - Completeness, both ways: every structure, `#define` and enum member
//!   in `emp.h` must be listed here, the listed fields must tile their
//!   structure, and every value the Rust enums decode (status, dtype,
//!   operator, barrier algorithm) must have a C constant.
//! - `libemp.so.1`, linked from the staticlib built with this test by
//!   `scripts/libemp-link.sh` (what `make build` runs) with `libemp.map`,
//!   has SONAME `libemp.so.1` and exports every function `emp.h` declares
//!   at the version `libemp.map` lists it in (`EMP_1.0`, then `EMP_1.1`,
//!   `EMP_1.2`, `EMP_1.3`, `EMP_1.4`, each node naming its predecessor), and nothing else; `libemp.map`
//!   lists exactly those functions, each once.

use core::mem::{offset_of, size_of};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use emp::ffi::{EmpEndpoint, EmpPortInfo, EmpProbed, EmpProbedEx, EmpRbcastAlgo, EmpRemoteWord, EmpWc, EmpWcEx};
use emp::{BarrierAlgo, Dtype, Opcode, ReduceOp, Sge, Status};

// ---------------------------------------------------------------------------
// The Rust side
// ---------------------------------------------------------------------------

/// The `<stdint.h>` type of a field's element, and whether it is an array.
trait CType {
    const C: &'static str;
    const ELEM_SIZE: usize;
    const ARRAY: bool = false;
}

macro_rules! c_int_type {
    ($($t:ty => $c:literal),*) => {$(
        impl CType for $t {
            const C: &'static str = $c;
            const ELEM_SIZE: usize = size_of::<$t>();
        }
    )*};
}
c_int_type!(u8 => "uint8_t", u16 => "uint16_t", u32 => "uint32_t", u64 => "uint64_t");
// Structures embedded in the `_ex` ones (EMP_1.4).
c_int_type!(EmpWc => "struct emp_wc", EmpProbed => "struct emp_probed");

impl<T: CType, const N: usize> CType for [T; N] {
    const C: &'static str = T::C;
    const ELEM_SIZE: usize = T::ELEM_SIZE;
    const ARRAY: bool = true;
}

struct Field {
    name: &'static str,
    offset: usize,
    size: usize,
    elem_size: usize,
    c_type: &'static str,
    array: bool,
}

fn field<S, F: CType>(name: &'static str, offset: usize, _project: impl Fn(&S) -> &F) -> Field {
    Field { name, offset, size: size_of::<F>(), elem_size: F::ELEM_SIZE, c_type: F::C, array: F::ARRAY }
}

struct Struct {
    /// C tag, without `struct`.
    c: &'static str,
    rust: &'static str,
    size: usize,
    fields: Vec<Field>,
}

macro_rules! st {
    ($c:literal, $ty:ty { $($f:ident),* $(,)? }) => {
        Struct {
            c: $c,
            rust: stringify!($ty),
            size: size_of::<$ty>(),
            fields: vec![$( field(stringify!($f), offset_of!($ty, $f), |s: &$ty| &s.$f) ),*],
        }
    };
}

fn structs() -> Vec<Struct> {
    vec![
        st!("emp_endpoint", EmpEndpoint { node, port }),
        st!("emp_sge", Sge { key, len, offset }),
        st!("emp_wc", EmpWc { wr_id, status, is_recv, byte_len, msg_len, tag, src_node, src_port, opcode, reserved }),
        st!("emp_remote_word", EmpRemoteWord { key, width, offset, secret, reserved }),
        st!("emp_probed", EmpProbed { tag, len, handle, src_node, src_port, reserved }),
        st!("emp_wc_ex", EmpWcEx { wc, imm, wc_flags }),
        st!("emp_probed_ex", EmpProbedEx { msg, imm, flags }),
        st!("emp_rbcast_algo", EmpRbcastAlgo { coroots, ack_every, window, naks, reserved }),
        st!("emp_port_info", EmpPortInfo { node, port, mtu, nodes, send_entries, recv_entries, reserved, msg_max }),
    ]
}

/// Structures `emp.h` only declares (opaque handles): never defined in C.
const OPAQUE: &[&str] = &["emp_device", "emp_group"];

/// `CamelCase` → `CAMEL_CASE`.
fn upper_snake(camel: &str) -> String {
    let mut s = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(ch.to_ascii_uppercase());
    }
    s
}

/// Every C constant and its Rust value. Enum members are derived from
/// every value the Rust enum decodes, so a new Rust value without a C name
/// shows up as a missing constant.
fn constants() -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    m.insert("EMP_ANY_NODE".into(), emp::ANY_NODE as u64);
    m.insert("EMP_ANY_PORT".into(), emp::ANY_PORT as u64);
    m.insert("EMP_ACCESS_LOCAL_READ".into(), emp::MR_LOCAL_READ as u64);
    m.insert("EMP_ACCESS_LOCAL_WRITE".into(), emp::MR_LOCAL_WRITE as u64);
    m.insert("EMP_ACCESS_REMOTE_READ".into(), emp::MR_REMOTE_READ as u64);
    m.insert("EMP_ACCESS_REMOTE_WRITE".into(), emp::MR_REMOTE_WRITE as u64);
    m.insert("EMP_ACCESS_REMOTE_ATOMIC".into(), emp::MR_REMOTE_ATOMIC as u64);
    for s in (0..=u8::MAX).filter_map(Status::from_u8) {
        m.insert(format!("EMP_WC_{}", upper_snake(&format!("{s:?}"))), s as u64);
    }
    // The opcodes a completion reports to C (`emp_wc.opcode`).
    for op in [
        Opcode::Send,
        Opcode::Recv,
        Opcode::AtomicFetchAdd,
        Opcode::AtomicCmpSwap,
        Opcode::AtomicSwap,
        Opcode::RdmaWrite,
        Opcode::RdmaRead,
        Opcode::RecvRdmaImm,
        Opcode::Probe,
        Opcode::Cancel,
        Opcode::Start,
    ] {
        m.insert(format!("EMP_WC_{}", upper_snake(&format!("{op:?}"))), op as u64);
    }
    for t in (0..=u8::MAX).filter_map(Dtype::from_u8) {
        m.insert(format!("EMP_{}", t.name().to_uppercase()), t as u64);
    }
    for op in (0..=u8::MAX).filter_map(ReduceOp::from_u8) {
        m.insert(format!("EMP_{}", op.name().to_uppercase()), op as u64);
    }
    for algo in (0..=u16::MAX).filter_map(BarrierAlgo::from_u16) {
        let c = match algo {
            BarrierAlgo::PairwiseExchange => "EMP_BARRIER_PAIRWISE",
            BarrierAlgo::Dissemination => "EMP_BARRIER_DISSEMINATION",
            BarrierAlgo::GatherRelease => "EMP_BARRIER_GATHER_RELEASE",
        };
        m.insert(c.into(), algo as u64);
    }
    m.insert("EMP_WC_WITH_IMM".into(), emp::ffi::EMP_WC_WITH_IMM as u64);
    m.insert("EMP_PERSIST_SLOTS".into(), emp::PERSIST_SLOTS as u64);
    m
}

// ---------------------------------------------------------------------------
// What emp.h says
// ---------------------------------------------------------------------------

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `text` (the file `what`) without its `/* … */` comments.
fn strip_block_comments(text: &str, what: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").unwrap_or_else(|| panic!("unterminated comment in {what}"));
        rest = &rest[i + end + 2..];
    }
    out.push_str(rest);
    out
}

/// emp.h without its comments.
fn header_code() -> String {
    let text = std::fs::read_to_string(manifest_dir().join("include/emp.h")).expect("include/emp.h");
    strip_block_comments(&text, "emp.h")
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let s = s.trim_start();
    &s[..s.find(|c| !is_ident(c)).unwrap_or(s.len())]
}

struct Header {
    /// `struct emp_x { … }` definitions.
    structs: BTreeSet<String>,
    /// `struct emp_x;` declarations without a definition.
    opaque: BTreeSet<String>,
    /// `#define EMP_…` and enum members.
    constants: BTreeSet<String>,
    /// Declared functions.
    functions: BTreeSet<String>,
}

fn parse_header() -> Header {
    let code = header_code();
    let mut h = Header {
        structs: BTreeSet::new(),
        opaque: BTreeSet::new(),
        constants: BTreeSet::new(),
        functions: BTreeSet::new(),
    };
    for line in code.lines() {
        if let Some(rest) = line.trim().strip_prefix("#define ") {
            let name = ident(rest);
            if name.starts_with("EMP_") && name != "EMP_H" {
                h.constants.insert(name.into());
            }
        }
    }
    let mut rest = code.as_str();
    while let Some(i) = rest.find("struct ") {
        let after = &rest[i + "struct ".len()..];
        let name = ident(after);
        let tail = after[name.len()..].trim_start();
        if tail.starts_with('{') {
            h.structs.insert(name.into());
        } else if tail.starts_with(';') {
            h.opaque.insert(name.into());
        }
        rest = &after[name.len()..];
    }
    let mut rest = code.as_str();
    while let Some(i) = rest.find("enum ") {
        let after = &rest[i + "enum ".len()..];
        let name = ident(after);
        let tail = after[name.len()..].trim_start();
        rest = &after[name.len()..];
        if let Some(body) = tail.strip_prefix('{') {
            let body = &body[..body.find('}').expect("enum body")];
            for member in body.split(',') {
                let m = ident(member);
                if !m.is_empty() {
                    h.constants.insert(m.into());
                }
            }
        }
    }
    // A function declaration: an `emp_` identifier followed by `(`.
    let mut rest = code.as_str();
    while let Some(i) = rest.find("emp_") {
        let at_word_start = i == 0 || !rest[..i].ends_with(is_ident);
        let name = ident(&rest[i..]);
        let tail = rest[i + name.len()..].trim_start();
        if at_word_start && tail.starts_with('(') {
            h.functions.insert(name.into());
        }
        rest = &rest[i + name.len()..];
    }
    h
}

// ---------------------------------------------------------------------------
// The C program
// ---------------------------------------------------------------------------

fn expected() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for s in structs() {
        m.insert(format!("size {}", s.c), s.size.to_string());
        for f in &s.fields {
            m.insert(
                format!("field {} {}", s.c, f.name),
                format!("offset={} size={} elem_size={} type={}", f.offset, f.size, f.elem_size, f.c_type),
            );
        }
    }
    for (name, value) in constants() {
        m.insert(format!("const {name}"), value.to_string());
    }
    m
}

fn c_program() -> String {
    let mut p = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"emp.h\"\n");
    // The exact <stdint.h> type (no integer promotion in _Generic).
    p.push_str(
        "#define EMP_INT_TYPE(x) _Generic((x), uint8_t: \"uint8_t\", uint16_t: \"uint16_t\", \\\n\
         \tuint32_t: \"uint32_t\", uint64_t: \"uint64_t\", \\\n\
         \tstruct emp_wc: \"struct emp_wc\", struct emp_probed: \"struct emp_probed\", default: \"(not-a-fixed-width-unsigned-integer)\")\n",
    );
    p.push_str("int main(void)\n{\n");
    for s in structs() {
        let t = format!("struct {}", s.c);
        p.push_str(&format!("\tprintf(\"size {} %zu\\n\", sizeof({t}));\n", s.c));
        for f in &s.fields {
            let lv = format!("(({t} *)0)->{}", f.name);
            let el = if f.array { format!("{lv}[0]") } else { lv.clone() };
            p.push_str(&format!(
                "\tprintf(\"field {} {} offset=%zu size=%zu elem_size=%zu type=%s\\n\", offsetof({t}, {}), \
                 sizeof({lv}), sizeof({el}), EMP_INT_TYPE({el}));\n",
                s.c, f.name, f.name
            ));
        }
    }
    for name in constants().keys() {
        p.push_str(&format!("\tprintf(\"const {name} %llu\\n\", (unsigned long long)({name}));\n"));
    }
    p.push_str("\treturn 0;\n}\n");
    p
}

fn c_compiler() -> Vec<String> {
    let runs = |cmd: &[String]| {
        Command::new(&cmd[0]).args(&cmd[1..]).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
    };
    if let Ok(v) = std::env::var("CC") {
        let words: Vec<String> = v.split_whitespace().map(String::from).collect();
        if !words.is_empty() {
            assert!(runs(&words), "CC={v:?} is set but `{v} --version` does not run");
            return words;
        }
    }
    ["cc", "gcc", "clang"]
        .iter()
        .map(|c| vec![c.to_string()])
        .find(|cmd| runs(cmd))
        .expect("no C compiler: CC is not set and none of cc, gcc, clang runs")
}

/// A fresh directory, removed on drop unless the test failed.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("emp-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Runs `cmd` and returns its stdout; panics with its output on failure.
fn run(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("UTF-8 output")
}

// ---------------------------------------------------------------------------
// libemp.so.1
// ---------------------------------------------------------------------------

/// The versions of the C ABI, oldest first: the nodes of `libemp.map`.
const ABI_VERSIONS: &[&str] =
    &["EMP_1.0", "EMP_1.1", "EMP_1.2", "EMP_1.3", "EMP_1.4", "EMP_1.5", "EMP_1.6", "EMP_1.7", "EMP_1.8", "EMP_1.9"];

/// The staticlib built with this test: in `deps/` next to it, as
/// `libemp-<metadata hash>.a` (the copy one level up is refreshed only by
/// `cargo build`). Several hashes can sit there (feature sets unified
/// differently by other cargo invocations); the newest is built from the
/// current source, because cargo rebuilds this test's own copy first when
/// the source changed.
fn staticlib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let entries = std::fs::read_dir(deps).unwrap_or_else(|e| panic!("reading {}: {e}", deps.display()));
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("libemp-") && n.ends_with(".a")))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, path)| path)
        .unwrap_or_else(|| panic!("no libemp-*.a in {} (libemp's crate-type includes staticlib)", deps.display()))
}

/// `libemp.so.1` (and its link-time name `libemp.so`), linked into `dir`
/// from [`staticlib`] by `scripts/libemp-link.sh`, as `make build` does.
fn link_libemp(dir: &Path) -> PathBuf {
    let script = manifest_dir().parent().expect("workspace").join("scripts/libemp-link.sh");
    run(Command::new(script).arg(staticlib()).arg(dir));
    dir.join("libemp.so.1")
}

/// Defined dynamic symbols of `so`, each with its version as `readelf`
/// prints it: `@@EMP_1.0` for the default version, `@EMP_1.0` for a hidden
/// one, empty for none. The symbols that stand for the version definitions
/// (`versions`) are left out.
fn exported(so: &Path, versions: &BTreeSet<String>) -> Vec<(String, String)> {
    let out = run(Command::new("readelf").args(["--dyn-syms", "-W"]).arg(so));
    let mut v = Vec::new();
    for line in out.lines() {
        // "  70: 0000000000018680   311 FUNC    GLOBAL DEFAULT   13 emp_post_bcast@@EMP_1.0"
        let words: Vec<&str> = line.split_whitespace().collect();
        let [num, _value, _size, kind, _bind, _vis, ndx, sym, ..] = words[..] else { continue };
        if num.trim_end_matches(':').parse::<u32>().is_err() || ndx == "UND" {
            continue;
        }
        let (name, version) = sym.find('@').map_or((sym, ""), |i| sym.split_at(i));
        if kind == "OBJECT" && ndx == "ABS" && version.is_empty() && versions.contains(name) {
            continue;
        }
        v.push((name.to_string(), version.to_string()));
    }
    v
}

/// `readelf -d` and `-V` of `so`: its SONAME and the names of the versions
/// it defines (the base version, named after the SONAME, included).
fn soname_and_version_definitions(so: &Path) -> (Option<String>, BTreeSet<String>) {
    let dynamic = run(Command::new("readelf").args(["-d", "-W"]).arg(so));
    // " 0x… (SONAME)   Library soname: [libemp.so.1]"
    let soname = dynamic
        .lines()
        .find(|l| l.contains("(SONAME)"))
        .and_then(|l| Some(l[l.find('[')? + 1..l.rfind(']')?].to_string()));
    let versions = run(Command::new("readelf").args(["-V", "-W"]).arg(so));
    // "  0x001c: Rev: 1  Flags: none  Index: 2  Cnt: 1  Name: EMP_1.0", in
    // the definition section only (the needs section names glibc's).
    let definitions = versions
        .split("Version needs section")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains("Rev:"))
        .filter_map(|l| l.split("Name: ").nth(1))
        .map(|n| n.trim().to_string())
        .collect();
    (soname, definitions)
}

/// A node of `libemp.map`: `EMP_1.0 { global: a; b; local: *; };` or
/// `EMP_1.1 { global: c; } EMP_1.0;`.
#[derive(Debug)]
struct VersionNode {
    name: String,
    global: BTreeSet<String>,
    local: BTreeSet<String>,
    /// The node it extends (after its closing brace).
    predecessor: Option<String>,
}

fn version_script() -> Vec<VersionNode> {
    let text = std::fs::read_to_string(manifest_dir().join("libemp.map")).expect("libemp.map");
    let code = strip_block_comments(&text, "libemp.map");
    let names = |s: &str| s.split(';').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
    let mut nodes = Vec::new();
    let mut rest = code.as_str();
    while let Some(open) = rest.find('{') {
        let close = open + rest[open..].find('}').expect("unclosed node in libemp.map");
        let body = &rest[open + 1..close];
        let (global, local) = body.split_once("local:").unwrap_or((body, ""));
        let global = global.trim_start();
        let global = global.strip_prefix("global:").unwrap_or(global);
        // Past "};" or "} EMP_1.0;" (a node naming its predecessor).
        let after = &rest[close + 1..];
        let semi = after.find(';').unwrap_or(after.len());
        let predecessor = Some(after[..semi].trim().to_string()).filter(|p| !p.is_empty());
        nodes.push(VersionNode {
            name: rest[..open].trim().to_string(),
            global: names(global),
            local: names(local),
            predecessor,
        });
        rest = &after[(semi + 1).min(after.len())..];
    }
    nodes
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// The tables above cover emp.h, and their fields tile each structure.
#[test]
fn tables_cover_the_header() {
    let h = parse_header();
    let mut errors = Vec::new();
    let listed: BTreeSet<String> = structs().iter().map(|s| s.c.to_string()).collect();
    for s in h.structs.difference(&listed) {
        errors.push(format!("struct {s} is defined in emp.h but not checked here"));
    }
    for s in listed.difference(&h.structs) {
        errors.push(format!("struct {s} is checked here but not defined in emp.h"));
    }
    let opaque: BTreeSet<String> = OPAQUE.iter().map(|s| s.to_string()).collect();
    if h.opaque != opaque {
        errors.push(format!("opaque structs in emp.h {:?}, expected {opaque:?}", h.opaque));
    }
    let consts: BTreeSet<String> = constants().into_keys().collect();
    for c in h.constants.difference(&consts) {
        errors.push(format!("{c} is in emp.h but has no Rust value here"));
    }
    for c in consts.difference(&h.constants) {
        errors.push(format!("{c} (a Rust value) is missing from emp.h"));
    }
    for s in structs() {
        let mut fields: Vec<&Field> = s.fields.iter().collect();
        fields.sort_by_key(|f| f.offset);
        let mut at = 0;
        for f in fields {
            if f.offset != at {
                errors.push(format!("{}::{} at {} but the previous field ends at {at}", s.rust, f.name, f.offset));
            }
            at = f.offset + f.size;
        }
        if at != s.size {
            errors.push(format!("{}: fields end at {at}, the struct is {} bytes", s.rust, s.size));
        }
    }
    assert!(h.functions.len() >= 30, "found only {} functions in emp.h: {:?}", h.functions.len(), h.functions);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Every structure field and constant of emp.h, as C compiles it, equals
/// the Rust side.
#[test]
fn header_layout_matches_rust() {
    let dir = TempDir::new("c-header");
    let src = dir.0.join("check.c");
    let exe = dir.0.join("check");
    std::fs::write(&src, c_program()).expect("write check.c");
    let cc = c_compiler();
    run(Command::new(&cc[0])
        .args(&cc[1..])
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(manifest_dir().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe));
    let out = run(&mut Command::new(&exe));
    let mut got = BTreeMap::new();
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let split = if words.first() == Some(&"field") { 3 } else { 2 };
        got.insert(words[..split].join(" "), words[split..].join(" "));
    }
    let want = expected();
    let mut errors = Vec::new();
    for (key, w) in &want {
        match got.get(key) {
            Some(g) if g == w => {}
            Some(g) => errors.push(format!("{key}: C says {g}, Rust says {w}")),
            None => errors.push(format!("{key}: not printed by the C program")),
        }
    }
    assert!(errors.is_empty(), "emp.h disagrees with the Rust ABI:\n{}", errors.join("\n"));
    assert_eq!(got.len(), want.len(), "the C program printed lines nobody expects");
}

/// `libemp.map` exports exactly the functions emp.h declares, each in one
/// node (`EMP_1.0`, then `EMP_1.1` extending it), and leaves everything
/// else local.
#[test]
fn version_script_lists_exactly_the_header() {
    let nodes = version_script();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ABI_VERSIONS, "libemp.map's nodes, oldest first");
    let all: BTreeSet<String> = ["*".to_string()].into();
    assert_eq!(nodes[0].local, all, "libemp.map must keep everything it does not list local (`local: *;`)");
    let mut errors = Vec::new();
    for (i, node) in nodes.iter().enumerate().skip(1) {
        if node.predecessor.as_deref() != Some(ABI_VERSIONS[i - 1]) {
            errors.push(format!(
                "{} must extend {} (`}} {};`), not {:?}",
                node.name,
                names[i - 1],
                names[i - 1],
                node.predecessor
            ));
        }
        if !node.local.is_empty() {
            errors.push(format!("{}: only the first node has `local:`", node.name));
        }
    }
    let mut listed = BTreeMap::new();
    for node in &nodes {
        for f in &node.global {
            if let Some(earlier) = listed.insert(f.clone(), node.name.clone()) {
                errors.push(format!("{f} is listed in both {earlier} and {}", node.name));
            }
        }
    }
    let listed: BTreeSet<String> = listed.into_keys().collect();
    let declared = parse_header().functions;
    for f in declared.difference(&listed) {
        errors.push(format!("{f} is declared in emp.h but libemp.map does not list it"));
    }
    for f in listed.difference(&declared) {
        errors.push(format!("libemp.map lists {f}, which emp.h does not declare"));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// libemp.so.1 has SONAME libemp.so.1 and exports exactly the functions
/// emp.h declares, each at the version libemp.map lists it in: no Rust
/// symbol leaks.
#[test]
fn shared_object_exports_exactly_the_header_at_its_version() {
    let dir = TempDir::new("libemp-link");
    let so = link_libemp(&dir.0);
    let link = std::fs::read_link(dir.0.join("libemp.so")).expect("libemp.so, the link-time name, is a symlink");
    assert_eq!(link, Path::new("libemp.so.1"), "libemp.so must point at libemp.so.1");

    let (soname, definitions) = soname_and_version_definitions(&so);
    assert_eq!(soname.as_deref(), Some("libemp.so.1"), "SONAME of {}", so.display());
    let want: BTreeSet<String> = ["libemp.so.1"].iter().chain(ABI_VERSIONS).map(|s| s.to_string()).collect();
    assert_eq!(definitions, want, "version definitions of {} (the base version and {ABI_VERSIONS:?})", so.display());
    let version_of: BTreeMap<String, String> = version_script()
        .into_iter()
        .flat_map(|node| node.global.into_iter().map(move |f| (f, node.name.clone())))
        .collect();

    let declared = parse_header().functions;
    let exported = exported(&so, &definitions);
    let names: BTreeSet<String> = exported.iter().map(|(n, _)| n.clone()).collect();
    let mut errors = Vec::new();
    for f in declared.difference(&names) {
        errors.push(format!("{f} is declared in emp.h but libemp.so.1 does not export it"));
    }
    for f in names.difference(&declared) {
        errors.push(format!("libemp.so.1 exports {f}, which emp.h does not declare"));
    }
    for (name, version) in &exported {
        let want = version_of.get(name).map_or("(not in libemp.map)", String::as_str);
        if *version != format!("@@{want}") {
            errors.push(format!("libemp.so.1 exports {name}{version}, not {name}@@{want}"));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
