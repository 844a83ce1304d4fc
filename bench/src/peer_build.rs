//! `memra-bench peer fetch` and `peer build`: the peer's source and binaries (DEVICE.md step 6).
//! The source is the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist: `fetch` downloads
//! it with pip (network needed), trims it (no models, docs, media, benches, examples or
//! non-CUDA ggml backends) and packs it into one tarball (`.stage/llama.tgz`, git-ignored) that
//! travels to the GPU machine; `build` unpacks it and builds llama-bench, llama-server and
//! llama-mtmd-cli with CUDA for the present arch, once per machine (`$HOME/llama.cpp/build/bin`). Every external
//! command is built by a function here, so the tests check the argument vectors without network
//! or GPU. llama.cpp's source and binaries are never committed.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The pip requirement whose sdist vendors the peer's llama.cpp.
pub const SDIST: &str = "llama-cpp-python==0.3.36";
/// The llama.cpp targets built.
pub const TARGETS: [&str; 3] = ["llama-bench", "llama-server", "llama-mtmd-cli"];
/// Top-level folders of the vendored tree that the build does not need.
const DROP: [&str; 4] = ["models", "docs", "media", "benches"];
/// The ggml backends kept (`ggml/src/ggml-NAME/`); the others are dropped.
const KEEP_BACKENDS: [&str; 3] = ["ggml-cpu", "ggml-cuda", "ggml-blas"];
/// The tarball `fetch` writes and `build` unpacks by default (relative to the repo root).
pub const DEFAULT_TARBALL: &str = ".stage/llama.tgz";

/// What fetching or building the peer can fail on, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("`{tool}` not found on PATH: {hint}")]
    ToolMissing { tool: String, hint: &'static str },
    #[error("pip could not fetch {SDIST}{why}; pip's last lines:\n{tail}")]
    Fetch { why: &'static str, tail: String },
    #[error("unexpected sdist layout in {}: {what}", path.display())]
    Layout { path: PathBuf, what: String },
    #[error("no llama.cpp source: {0}")]
    NoSource(String),
    #[error("`{cmd}` failed ({status}){tail}")]
    Failed {
        cmd: String,
        status: String,
        tail: String,
    },
    #[error("nvidia-smi's compute capability `{0}` is not MAJOR.MINOR (pass --arch, e.g. 90a)")]
    ComputeCap(String),
    #[error("llama-bench not found in {}: {hint}", dir.display())]
    NoBuild { dir: PathBuf, hint: &'static str },
    #[error("no --dir and $HOME is unset")]
    NoHome,
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, PeerError>;

impl From<PeerError> for memra_engine::error::Error {
    fn from(e: PeerError) -> Self {
        memra_engine::error::Error::Backend {
            backend: "peer llama.cpp".into(),
            what: e.to_string(),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PeerError + '_ {
    move |source| PeerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One external command: program, arguments, working folder and extra environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cmd {
    pub program: String,
    pub args: Vec<OsString>,
    pub dir: Option<PathBuf>,
    pub env: Vec<(String, OsString)>,
}

impl Cmd {
    pub fn new(program: &str) -> Self {
        Cmd {
            program: program.into(),
            ..Cmd::default()
        }
    }

    fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Program and arguments as text (for messages and tests).
    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.clone())
            .chain(self.args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect()
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args);
        if let Some(d) = &self.dir {
            c.current_dir(d);
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    fn spawn_error(&self, e: std::io::Error) -> PeerError {
        if e.kind() != std::io::ErrorKind::NotFound {
            return PeerError::Io {
                path: self.program.clone().into(),
                source: e,
            };
        }
        let hint = match self.program.as_str() {
            "python3" => "python3 with pip downloads the sdist (`peer fetch` needs network)",
            "cmake" => "cmake (and ideally ninja) builds llama.cpp; or pass --llama-bin DIR",
            "nvidia-smi" => "it names the GPU's compute capability; pass --arch (90a on H200)",
            _ => "install it",
        };
        PeerError::ToolMissing {
            tool: self.program.clone(),
            hint,
        }
    }

    /// Runs it with its stdout sent to stderr (so a caller's stdout holds only the result).
    fn run_to_stderr(&self) -> Result<()> {
        eprintln!("+ {self}");
        let status = self
            .command()
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| self.spawn_error(e))?;
        if status.success() {
            return Ok(());
        }
        Err(PeerError::Failed {
            cmd: self.to_string(),
            status: status.to_string(),
            tail: String::new(),
        })
    }

    /// Runs it with its output captured.
    pub fn output(&self) -> Result<Output> {
        self.command().output().map_err(|e| self.spawn_error(e))
    }

    /// Runs it captured and fails with the last lines of its stderr when it fails.
    pub fn run_quiet(&self) -> Result<()> {
        let o = self.output()?;
        if o.status.success() {
            return Ok(());
        }
        Err(PeerError::Failed {
            cmd: self.to_string(),
            status: o.status.to_string(),
            tail: format!(": {}", tail(&String::from_utf8_lossy(&o.stderr), 3)),
        })
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.argv().join(" "))
    }
}

/// The last `n` non-empty lines of a log.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `pip download` of the sdist into `tmp` (as tools/device/peer-src.sh did): pip unpacks it and
/// then fails to prepare its metadata (no build isolation, so it does not first build cmake and
/// ninja from source); `--no-clean` keeps the unpacked tree, TMPDIR keeps it under `tmp`.
pub fn pip_download(tmp: &Path) -> Cmd {
    let mut c = Cmd::new("python3").args(["-m", "pip", "download", "--no-clean", "--no-deps"]);
    c = c.args(["--no-binary", ":all:", "--no-build-isolation", SDIST, "-d"]);
    c.args.push(tmp.into());
    c.env.push(("TMPDIR".into(), tmp.into()));
    c
}

/// `tar czf OUT -C PARENT NAME`: packs the folder `tree` under its own name.
pub fn tar_create(out: &Path, tree: &Path) -> Cmd {
    let parent = tree.parent().unwrap_or(Path::new("."));
    let name = tree.file_name().unwrap_or(tree.as_os_str());
    Cmd::new("tar").args([
        OsString::from("czf"),
        out.into(),
        "-C".into(),
        parent.into(),
        name.into(),
    ])
}

/// `tar xzf TARBALL -C DIR --strip-components=1`: the tarball's top folder becomes `dir`.
pub fn tar_extract(tarball: &Path, dir: &Path) -> Cmd {
    Cmd::new("tar").args([
        OsString::from("xzf"),
        tarball.into(),
        "-C".into(),
        dir.into(),
        "--strip-components=1".into(),
    ])
}

/// How llama.cpp is configured and built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildPlan {
    /// The llama.cpp source tree.
    pub src: PathBuf,
    /// The cmake build folder (its `bin/` holds llama-bench).
    pub build: PathBuf,
    /// CMAKE_CUDA_ARCHITECTURES (e.g. `90a`).
    pub arch: String,
    /// Generate for ninja (when it is on PATH).
    pub ninja: bool,
    /// Parallel compile jobs.
    pub jobs: usize,
    /// Run the compile under `nice -n 10` (when nice is on PATH).
    pub nice: bool,
}

impl BuildPlan {
    /// The cmake configure command (DEVICE.md step 6).
    pub fn configure(&self) -> Cmd {
        let mut c = Cmd::new("cmake");
        c.args.extend([
            OsString::from("-S"),
            self.src.clone().into(),
            "-B".into(),
            self.build.clone().into(),
        ]);
        if self.ninja {
            c = c.args(["-G", "Ninja"]);
        }
        c.args([
            "-DGGML_CUDA=ON".to_string(),
            format!("-DCMAKE_CUDA_ARCHITECTURES={}", self.arch),
            "-DLLAMA_CURL=OFF".into(),
            "-DLLAMA_OPENSSL=OFF".into(),
            "-DLLAMA_BUILD_TESTS=OFF".into(),
            "-DLLAMA_BUILD_EXAMPLES=OFF".into(),
            "-DCMAKE_BUILD_TYPE=Release".into(),
        ])
    }

    /// The compile command: llama-bench, llama-server and llama-mtmd-cli (tools/mtmd; the
    /// side by side of the vision tower, tools/device/mtmd_bench.sh) only.
    pub fn compile(&self) -> Cmd {
        let mut c = if self.nice {
            Cmd::new("nice").args(["-n", "10", "cmake"])
        } else {
            Cmd::new("cmake")
        };
        c.args
            .extend([OsString::from("--build"), self.build.clone().into()]);
        c = c.args([format!("-j{}", self.jobs.max(1)), "--target".into()]);
        c.args(TARGETS)
    }
}

/// CMAKE_CUDA_ARCHITECTURES from nvidia-smi's `compute_cap` lines (`9.0` -> `90a`, `12.0` ->
/// `120a`; before 9.0 there are no arch-specific `a` targets: `8.9` -> `89`). Several GPUs of
/// different kinds give a `;` list.
pub fn arch_from_compute_caps(text: &str) -> Result<String> {
    let mut archs: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || PeerError::ComputeCap(line.into());
        let (major, minor) = line.split_once('.').ok_or_else(bad)?;
        let major: u32 = major.parse().map_err(|_| bad())?;
        let minor: u32 = minor.parse().map_err(|_| bad())?;
        if major == 0 || minor > 9 {
            return Err(bad());
        }
        let arch = format!("{major}{minor}{}", if major >= 9 { "a" } else { "" });
        if !archs.contains(&arch) {
            archs.push(arch);
        }
    }
    if archs.is_empty() {
        return Err(PeerError::ComputeCap(text.trim().into()));
    }
    Ok(archs.join(";"))
}

/// `nvidia-smi --query-gpu=compute_cap --format=csv,noheader`.
pub fn nvidia_smi_compute_cap() -> Cmd {
    Cmd::new("nvidia-smi").args(["--query-gpu=compute_cap", "--format=csv,noheader"])
}

/// The present GPUs' arch, from nvidia-smi.
pub fn detect_arch() -> Result<String> {
    let cmd = nvidia_smi_compute_cap();
    let o = cmd.output()?;
    if !o.status.success() {
        return Err(PeerError::Failed {
            cmd: cmd.to_string(),
            status: o.status.to_string(),
            tail: " (no GPU here? pass --arch, e.g. 90a)".into(),
        });
    }
    arch_from_compute_caps(&String::from_utf8_lossy(&o.stdout))
}

/// Whether `program` is an executable file in a folder of PATH.
pub fn on_path(program: &str) -> bool {
    memra_engine::settings::search_path()
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Drops what the build does not need from the vendored tree `l` (`vendor/llama.cpp`): models/,
/// docs/, media/, benches/, the contents of examples/ and every `ggml/src/ggml-*/` backend but
/// cpu, cuda and blas (tools/ui stays: CMake needs it).
pub fn trim_tree(l: &Path) -> Result<()> {
    for need in ["CMakeLists.txt", "ggml/src"] {
        if !l.join(need).exists() {
            return Err(PeerError::Layout {
                path: l.into(),
                what: format!("no {need} in the vendored llama.cpp"),
            });
        }
    }
    let rm = |p: &Path| std::fs::remove_dir_all(p).map_err(io(p));
    for d in DROP.iter().map(|d| l.join(d)).filter(|p| p.is_dir()) {
        rm(&d)?;
    }
    let children = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io(dir))? {
            v.push(e.map_err(io(dir))?.path());
        }
        Ok(v)
    };
    let examples = l.join("examples");
    if examples.is_dir() {
        for p in children(&examples)? {
            if p.is_dir() {
                rm(&p)?;
            } else {
                std::fs::remove_file(&p).map_err(io(&p))?;
            }
        }
    }
    for p in children(&l.join("ggml/src"))? {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        if p.is_dir() && name.starts_with("ggml-") && !KEEP_BACKENDS.contains(&name.as_ref()) {
            rm(&p)?;
        }
    }
    Ok(())
}

/// Finds the unpacked sdist under `root` (pip's temporary folders, up to three levels down)
/// and returns its `vendor/llama.cpp`. An sdist tarball found instead (pip kept the download)
/// is unpacked first. `Ok(None)`: pip fetched nothing.
pub fn find_vendored(root: &Path) -> Result<Option<PathBuf>> {
    let mut sdist_dirs = Vec::new();
    let mut tarballs = Vec::new();
    let mut level = vec![root.to_path_buf()];
    for _ in 0..3 {
        let mut next = Vec::new();
        for dir in &level {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for p in rd.flatten().map(|e| e.path()) {
                let name = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                let sdist =
                    name.starts_with("llama-cpp-python") || name.starts_with("llama_cpp_python");
                if p.is_dir() && sdist {
                    sdist_dirs.push(p);
                } else if p.is_dir() {
                    next.push(p);
                } else if sdist && name.ends_with(".tar.gz") {
                    tarballs.push(p);
                }
            }
        }
        level = next;
    }
    if sdist_dirs.is_empty()
        && let Some(t) = tarballs.first()
    {
        let dir = root.join("sdist");
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        tar_extract(t, &dir).run_quiet()?;
        sdist_dirs.push(dir);
    }
    let Some(d) = sdist_dirs.first() else {
        return Ok(None);
    };
    let l = d.join("vendor/llama.cpp");
    if !l.join("CMakeLists.txt").is_file() {
        return Err(PeerError::Layout {
            path: d.clone(),
            what: "no vendor/llama.cpp/CMakeLists.txt (is it still the 0.3.36 sdist?)".into(),
        });
    }
    Ok(Some(l))
}

/// The error for a pip run that left no sdist, from its log.
pub fn fetch_failure(log: &str) -> PeerError {
    const NETWORK: [&str; 7] = [
        "NewConnectionError",
        "Failed to establish a new connection",
        "Temporary failure in name resolution",
        "Network is unreachable",
        "ConnectTimeoutError",
        "ProxyError",
        "No matching distribution found",
    ];
    let why = if NETWORK.iter().any(|n| log.contains(n)) {
        " (no network? PyPI was not reached; run `peer fetch` where it is, and carry the tarball)"
    } else {
        ""
    };
    PeerError::Fetch {
        why,
        tail: tail(log, 4),
    }
}

/// A temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(io(&p))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `peer fetch`: downloads the sdist with pip, trims its vendored llama.cpp and packs it into
/// `out` (written whole or not at all). Returns the tarball's size in bytes.
pub fn fetch(out: &Path) -> Result<u64> {
    let tmp = TempDir::new("memra-peer-fetch")?;
    let check = Cmd::new("python3").args(["-m", "pip", "--version"]);
    let o = check.output()?;
    if !o.status.success() {
        return Err(PeerError::ToolMissing {
            tool: "python3 -m pip".into(),
            hint: "install pip for python3 (it downloads the sdist)",
        });
    }
    let pip = pip_download(&tmp.0);
    eprintln!("+ {pip}");
    let o = pip.output()?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let l = find_vendored(&tmp.0)?.ok_or_else(|| fetch_failure(&log))?;
    trim_tree(&l)?;
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(p) = parent {
        std::fs::create_dir_all(p).map_err(io(p))?;
    }
    let mut part = out.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    if let Err(e) = tar_create(&part, &l).run_quiet() {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, out).map_err(io(out))?;
    Ok(std::fs::metadata(out).map_err(io(out))?.len())
}

/// Where llama.cpp lives by default: `$HOME/llama.cpp` (its build in `build/bin`).
pub fn default_dir(home: Option<&Path>) -> Result<PathBuf> {
    home.map(|h| h.join("llama.cpp")).ok_or(PeerError::NoHome)
}

/// The folder of the built binaries under a llama.cpp folder.
pub fn bin_dir(dir: &Path) -> PathBuf {
    dir.join("build").join("bin")
}

/// The flags of `peer build`.
#[derive(Clone, Debug, Default)]
pub struct BuildArgs {
    /// Source tree and build (`DIR/build`).
    pub dir: PathBuf,
    /// An existing llama.cpp source tree, built into `dir/build`.
    pub src: Option<PathBuf>,
    /// A tarball from `peer fetch`, unpacked into `dir`.
    pub tarball: Option<PathBuf>,
    /// CMAKE_CUDA_ARCHITECTURES; detected with nvidia-smi when absent.
    pub arch: Option<String>,
    /// Compile jobs (default: the cores less two).
    pub jobs: Option<usize>,
}

/// Where the source comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A source tree, used in place.
    Tree(PathBuf),
    /// A tarball to unpack into `dir` first.
    Tarball(PathBuf),
}

/// The source of a build: `--src`, `--tarball`, a tree already in `dir`, else the default
/// tarball (`.stage/llama.tgz`); an error naming what to do when there is none.
pub fn source(a: &BuildArgs) -> Result<Source> {
    if let Some(s) = &a.src {
        if !s.join("CMakeLists.txt").is_file() {
            return Err(PeerError::NoSource(format!(
                "--src {} holds no CMakeLists.txt",
                s.display()
            )));
        }
        return Ok(Source::Tree(s.clone()));
    }
    if let Some(t) = &a.tarball {
        if !t.is_file() {
            return Err(PeerError::NoSource(format!(
                "--tarball {} does not exist (`memra-bench peer fetch --out {}` writes it, on a machine with network)",
                t.display(),
                t.display()
            )));
        }
        return Ok(Source::Tarball(t.clone()));
    }
    if a.dir.join("CMakeLists.txt").is_file() {
        return Ok(Source::Tree(a.dir.clone()));
    }
    let t = PathBuf::from(DEFAULT_TARBALL);
    if t.is_file() {
        return Ok(Source::Tarball(t));
    }
    Err(PeerError::NoSource(format!(
        "{} holds none and {DEFAULT_TARBALL} does not exist: run `memra-bench peer fetch` on a \
         machine with network (and carry {DEFAULT_TARBALL}), or pass --src DIR or --tarball FILE",
        a.dir.display()
    )))
}

/// `peer build`: returns the folder holding llama-bench, and whether it was there already.
pub fn build(a: &BuildArgs) -> Result<(PathBuf, bool)> {
    let bin = bin_dir(&a.dir);
    if TARGETS.iter().all(|t| bin.join(t).is_file()) {
        return Ok((bin, true));
    }
    let src = match source(a)? {
        Source::Tree(s) => s,
        Source::Tarball(t) => {
            std::fs::create_dir_all(&a.dir).map_err(io(&a.dir))?;
            eprintln!("unpacking {} into {}", t.display(), a.dir.display());
            tar_extract(&t, &a.dir).run_quiet()?;
            if !a.dir.join("CMakeLists.txt").is_file() {
                return Err(PeerError::NoSource(format!(
                    "{} did not unpack a llama.cpp tree (no CMakeLists.txt in {})",
                    t.display(),
                    a.dir.display()
                )));
            }
            a.dir.clone()
        }
    };
    let arch = match &a.arch {
        Some(x) => x.clone(),
        None => detect_arch()?,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let plan = BuildPlan {
        src,
        build: a.dir.join("build"),
        arch,
        ninja: on_path("ninja"),
        jobs: a.jobs.unwrap_or(cores.saturating_sub(2).max(1)),
        nice: on_path("nice"),
    };
    plan.configure().run_to_stderr()?;
    plan.compile().run_to_stderr()?;
    if !bin.join("llama-bench").is_file() {
        return Err(PeerError::NoBuild {
            dir: bin,
            hint: "the build succeeded but did not write it (a changed CMake layout?)",
        });
    }
    Ok((bin, false))
}

/// The folder of llama-bench for `peer llama.cpp`: `--llama-bin`, else the build of
/// `peer build` in `default` (`$HOME/llama.cpp`), checked to hold llama-bench.
pub fn resolve_llama_bin(explicit: Option<&Path>, default: &Path) -> Result<PathBuf> {
    let (dir, hint) = match explicit {
        Some(d) => (
            d.to_path_buf(),
            "--llama-bin must name the folder holding it",
        ),
        None => (
            bin_dir(default),
            "build it with `memra-bench peer build` (its source: `memra-bench peer fetch` on a \
             machine with network), or pass --llama-bin DIR",
        ),
    };
    if dir.join("llama-bench").is_file() {
        Ok(dir)
    } else {
        Err(PeerError::NoBuild { dir, hint })
    }
}
