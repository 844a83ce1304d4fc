//! `memra-bench peer fetch|build`: the commands built for pip, tar, cmake and nvidia-smi, the
//! arch mapping, the cache hit and the errors, without network or GPU (a real tar only).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use memra_bench::peer_build::*;

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

#[test]
fn pip_download_is_the_sdist_without_deps_or_binaries_kept_unpacked() {
    let c = pip_download(Path::new("/t/x"));
    let want = [
        "python3",
        "-m",
        "pip",
        "download",
        "--no-clean",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--no-build-isolation",
        "llama-cpp-python==0.3.36",
        "-d",
        "/t/x",
    ];
    assert_eq!(c.argv(), strs(&want));
    assert_eq!(c.env, vec![("TMPDIR".to_string(), OsString::from("/t/x"))]);
}

#[test]
fn cmake_configure_and_compile_are_the_device_recipe() {
    let mut plan = BuildPlan {
        src: "/h/llama.cpp".into(),
        build: "/h/llama.cpp/build".into(),
        arch: "90a".into(),
        ninja: true,
        jobs: 14,
        nice: true,
    };
    let flags = [
        "-DGGML_CUDA=ON",
        "-DCMAKE_CUDA_ARCHITECTURES=90a",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
    ];
    let head = [
        "cmake",
        "-S",
        "/h/llama.cpp",
        "-B",
        "/h/llama.cpp/build",
        "-G",
        "Ninja",
    ];
    assert_eq!(
        plan.configure().argv(),
        strs(&[&head[..], &flags[..]].concat())
    );
    assert_eq!(
        plan.compile().argv(),
        strs(&[
            "nice",
            "-n",
            "10",
            "cmake",
            "--build",
            "/h/llama.cpp/build",
            "-j14",
            "--target",
            "llama-bench",
            "llama-server",
            "llama-mtmd-cli",
        ])
    );
    (plan.ninja, plan.nice, plan.jobs, plan.arch) = (false, false, 0, "120a".into());
    let c = plan.configure().argv();
    assert!(!c.contains(&"Ninja".to_string()));
    assert!(c.contains(&"-DCMAKE_CUDA_ARCHITECTURES=120a".to_string()));
    assert_eq!(
        plan.compile().argv()[..4],
        strs(&["cmake", "--build", "/h/llama.cpp/build", "-j1"])
    );
}

#[test]
fn compute_caps_map_to_cuda_archs() {
    let ok = |t: &str| arch_from_compute_caps(t).unwrap();
    assert_eq!(ok("9.0\n"), "90a");
    assert_eq!(ok("12.0"), "120a");
    assert_eq!(ok("10.0\n"), "100a");
    assert_eq!(ok("8.9"), "89");
    assert_eq!(ok(" 9.0 \n9.0\n"), "90a");
    assert_eq!(ok("9.0\n12.0\n"), "90a;120a");
    for bad in ["", "\n", "9", "x.y", "9.0.1", "0.5", "[N/A]"] {
        let e = arch_from_compute_caps(bad).unwrap_err();
        assert!(matches!(e, PeerError::ComputeCap(_)), "{bad:?}: {e}");
        assert!(e.to_string().contains("--arch"));
    }
    assert_eq!(
        nvidia_smi_compute_cap().argv(),
        strs(&[
            "nvidia-smi",
            "--query-gpu=compute_cap",
            "--format=csv,noheader"
        ])
    );
}

#[test]
fn an_existing_build_is_a_cache_hit_that_runs_nothing() {
    let t = tempfile::tempdir().unwrap();
    // Every target: a build of llama-bench alone (before llama-mtmd-cli) is a miss.
    for x in TARGETS {
        touch(&t.path().join("build/bin").join(x));
    }
    // No source, no tarball, no arch: a cache miss would fail on each of them.
    let a = BuildArgs {
        dir: t.path().into(),
        tarball: Some(t.path().join("absent.tgz")),
        ..BuildArgs::default()
    };
    let (bin, cached) = build(&a).unwrap();
    assert_eq!((bin.clone(), cached), (t.path().join("build/bin"), true));
    assert_eq!(resolve_llama_bin(None, t.path()).unwrap(), bin);
    assert_eq!(
        resolve_llama_bin(Some(&bin), Path::new("/nowhere")).unwrap(),
        bin
    );
}

#[test]
fn missing_sources_and_builds_name_what_to_run() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("llama.cpp");
    let tarball = t.path().join("llama.tgz");
    let a = BuildArgs {
        dir: dir.clone(),
        tarball: Some(tarball.clone()),
        ..BuildArgs::default()
    };
    let e = build(&a).unwrap_err().to_string();
    assert!(
        e.contains(&tarball.display().to_string()) && e.contains("peer fetch"),
        "{e}"
    );
    let a = BuildArgs {
        dir: dir.clone(),
        src: Some(t.path().into()),
        ..BuildArgs::default()
    };
    let e = build(&a).unwrap_err().to_string();
    assert!(e.contains("--src") && e.contains("CMakeLists.txt"), "{e}");
    // Neither: the default .stage/llama.tgz is not in the test's folder (bench/).
    let a = BuildArgs {
        dir: dir.clone(),
        ..BuildArgs::default()
    };
    let e = source(&a).unwrap_err().to_string();
    assert!(
        e.contains("peer fetch") && e.contains(DEFAULT_TARBALL),
        "{e}"
    );
    touch(&dir.join("CMakeLists.txt"));
    assert_eq!(source(&a).unwrap(), Source::Tree(dir.clone()));
    let e = resolve_llama_bin(None, &dir).unwrap_err().to_string();
    assert!(
        e.contains("build/bin") && e.contains("memra-bench peer build"),
        "{e}"
    );
    let e = resolve_llama_bin(Some(&dir), &dir).unwrap_err().to_string();
    assert!(e.contains("--llama-bin"), "{e}");
    assert!(matches!(default_dir(None), Err(PeerError::NoHome)));
    assert_eq!(
        default_dir(Some(Path::new("/h"))).unwrap(),
        Path::new("/h/llama.cpp")
    );
}

/// A vendored tree as the sdist holds it, under pip's kept unpack folder.
fn fake_sdist(root: &Path) -> PathBuf {
    let l = root.join("pip-install-abc/llama-cpp-python_0123/vendor/llama.cpp");
    for f in [
        "CMakeLists.txt",
        "models/ggml-vocab.gguf",
        "docs/build.md",
        "media/logo.png",
        "benches/b.txt",
        "examples/simple/simple.cpp",
        "examples/CMakeLists.txt",
        "ggml/src/ggml.c",
        "ggml/src/ggml-cpu/cpu.c",
        "ggml/src/ggml-cuda/mmq.cu",
        "ggml/src/ggml-blas/blas.cpp",
        "ggml/src/ggml-vulkan/v.cpp",
        "ggml/src/ggml-metal/m.m",
        "tools/ui/index.html",
        "tools/llama-bench/llama-bench.cpp",
    ] {
        touch(&l.join(f));
    }
    l
}

#[test]
fn the_vendored_tree_is_found_trimmed_and_packed() {
    let t = tempfile::tempdir().unwrap();
    assert_eq!(find_vendored(t.path()).unwrap(), None);
    let l = fake_sdist(t.path());
    assert_eq!(find_vendored(t.path()).unwrap(), Some(l.clone()));
    trim_tree(&l).unwrap();
    for gone in [
        "models",
        "docs",
        "media",
        "benches",
        "examples/simple",
        "examples/CMakeLists.txt",
        "ggml/src/ggml-vulkan",
        "ggml/src/ggml-metal",
    ] {
        assert!(!l.join(gone).exists(), "{gone}");
    }
    for kept in [
        "CMakeLists.txt",
        "examples",
        "ggml/src/ggml.c",
        "ggml/src/ggml-cpu/cpu.c",
        "ggml/src/ggml-cuda/mmq.cu",
        "ggml/src/ggml-blas/blas.cpp",
        "tools/ui/index.html",
    ] {
        assert!(l.join(kept).exists(), "{kept}");
    }
    // Packed under its own name, unpacked into any folder (real tar, as on the device).
    let tgz = t.path().join("llama.tgz");
    let c = tar_create(&tgz, &l);
    assert_eq!(
        c.argv()[..5],
        strs(&[
            "tar",
            "czf",
            &tgz.display().to_string(),
            "-C",
            &l.parent().unwrap().display().to_string()
        ])
    );
    assert_eq!(c.argv()[5], "llama.cpp");
    c.run_quiet().unwrap();
    let dir = t.path().join("home/llama.cpp");
    std::fs::create_dir_all(&dir).unwrap();
    tar_extract(&tgz, &dir).run_quiet().unwrap();
    assert!(dir.join("ggml/src/ggml-cuda/mmq.cu").is_file());
    assert!(!dir.join("ggml/src/ggml-metal").exists());
    let e = tar_extract(&t.path().join("none.tgz"), &dir)
        .run_quiet()
        .unwrap_err();
    assert!(matches!(e, PeerError::Failed { .. }), "{e}");
}

#[test]
fn an_unexpected_sdist_layout_is_named() {
    let t = tempfile::tempdir().unwrap();
    touch(&t.path().join("pip-x/llama-cpp-python_9/pyproject.toml"));
    let e = find_vendored(t.path()).unwrap_err();
    assert!(matches!(e, PeerError::Layout { .. }), "{e}");
    assert!(e.to_string().contains("vendor/llama.cpp"), "{e}");
    let l = t.path().join("flat");
    touch(&l.join("README.md"));
    let e = trim_tree(&l).unwrap_err().to_string();
    assert!(e.contains("CMakeLists.txt"), "{e}");
}

#[test]
fn a_failed_pip_names_the_network() {
    let log = "Collecting llama-cpp-python==0.3.36\n  WARNING: Retrying ... NewConnectionError('<...>: Failed to establish a new connection: [Errno -3] Temporary failure in name resolution')\nERROR: Could not find a version that satisfies the requirement llama-cpp-python==0.3.36\nERROR: No matching distribution found for llama-cpp-python==0.3.36\n";
    let e = fetch_failure(log).to_string();
    assert!(
        e.contains("no network") && e.contains("No matching distribution"),
        "{e}"
    );
    let e = fetch_failure("ERROR: something else\n").to_string();
    assert!(
        !e.contains("no network") && e.contains("something else"),
        "{e}"
    );
}

/// tools/device/peer.sh keeps a shell copy of the recipe for a machine without memra-bench.
#[test]
fn the_shell_fallback_of_peer_sh_builds_the_same() {
    let sh = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/device/peer.sh");
    let sh = std::fs::read_to_string(sh).unwrap();
    let plan = BuildPlan {
        src: ".".into(),
        build: "build".into(),
        arch: "${PEER_ARCH:-90a}".into(),
        ninja: true,
        jobs: 14,
        nice: true,
    };
    let flags = plan.configure().argv();
    for f in &flags[5..] {
        let f = f.replace("=$", "=\"$").replace('}', "}\"");
        assert!(sh.contains(&f), "peer.sh lacks {f}");
    }
    assert!(sh.contains(&plan.compile().to_string()));
    assert!(sh.contains("peer build --dir \"$LL\""));
}

#[test]
fn a_missing_tool_is_named_with_a_hint() {
    let c = Cmd::new("memra-no-such-tool-xyz");
    let e = c.output().unwrap_err();
    assert!(matches!(e, PeerError::ToolMissing { .. }), "{e}");
    // cmake where PATH holds none (the child's PATH is the one searched).
    let mut c = Cmd::new("cmake");
    c.env.push(("PATH".into(), OsString::from("/nonexistent")));
    let e = c.output().unwrap_err().to_string();
    assert!(
        e.contains("`cmake` not found") && e.contains("--llama-bin"),
        "{e}"
    );
}
