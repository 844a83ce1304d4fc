//! The binary's two jobs: `keys` subcommands and `serve`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use memra_server::auth::{Auth, KeyringWatch};
use memra_server::config::{KeysAction, ServeArgs};
use memra_server::keys::KeyringFile;
use memra_server::state::{Limits, State};

pub fn keys(action: KeysAction, path: &Path) -> Result<(), String> {
    let mut ring = KeyringFile::load(path)?;
    match action {
        KeysAction::Add {
            tenant,
            max_in_flight,
        } => {
            let key = ring.add(&tenant, max_in_flight)?;
            ring.save(path)?;
            eprintln!(
                "added a key for tenant `{tenant}` to {}; it is shown only now:",
                path.display()
            );
            println!("{key}");
        }
        KeysAction::Revoke { prefix } => {
            let e = ring.revoke(&prefix)?;
            ring.save(path)?;
            println!("revoked {} (tenant `{}`)", e.prefix, e.tenant);
        }
        KeysAction::List => {
            for k in &ring.keys {
                let state = if k.revoked { "revoked" } else { "active" };
                println!("{}  {}  {state}", k.prefix, k.tenant);
            }
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
        _ = term => tracing::info!("SIGTERM: draining"),
    }
}

pub fn serve(args: ServeArgs) -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log)
                .map_err(|e| format!("MEMRA_LOG `{}`: {e}", args.log))?,
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let specs = args.model_specs()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(async move {
        let auth = match &args.api_keys {
            Some(p) => {
                let w = Arc::new(KeyringWatch::open(p.clone())?);
                w.spawn_watcher(Duration::from_millis(args.keys_poll_ms.max(50)));
                tracing::info!("API keys required (keyring {})", p.display());
                if w.keyring().active() == 0 {
                    tracing::warn!(
                        "the keyring has no active key: every inference request will get 401; \
                         add one with `memra-server keys add TENANT`"
                    );
                }
                Auth::Keyring(w)
            }
            None => {
                tracing::warn!(
                    "no keyring (MEMRA_API_KEYS): the server is OPEN, every request is tenant `default`"
                );
                Auth::Open
            }
        };
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", args.addr))?;
        let (fail_tx, fail_rx) = tokio::sync::oneshot::channel::<String>();
        let on_error = Box::new(move |e: String| {
            let _ = fail_tx.send(e);
        });
        let engine = crate::engine_loader::start(&specs, &args, on_error)?;
        let mut limits = Limits::from_args(&args);
        let nofile = memra_server::fdlimit::raise_nofile();
        let cap = memra_server::fdlimit::connection_cap(limits.max_connections, nofile);
        if cap < limits.max_connections {
            tracing::warn!(
                "--max-connections {} lowered to {cap}: the open-file limit is {}",
                limits.max_connections,
                nofile.unwrap_or(0)
            );
        }
        limits.max_connections = cap;
        let state = Arc::new(State::new(engine, auth, limits));
        let bound = listener
            .local_addr()
            .map_err(|e| format!("listening socket: {e}"))?;
        tracing::info!("listening on http://{bound} (ready once the models load)");
        let failed = Arc::new(std::sync::Mutex::new(None::<String>));
        let f2 = failed.clone();
        let load_failed = async move {
            match fail_rx.await {
                Ok(e) => {
                    if let Ok(mut f) = f2.lock() {
                        *f = Some(e);
                    }
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        let stop = async {
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = load_failed => {}
            }
        };
        memra_server::serve(listener, state, stop)
            .await
            .map_err(|e| e.to_string())?;
        match failed.lock().ok().and_then(|mut f| f.take()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}
