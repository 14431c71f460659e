//! Black-box (issue 32, finding 5): two processes on one database must share one wallet seed and one session-token secret, whatever the order they start in.

use crate::support;

use support::{Db, Env};

/// Before, the seed check compared only with existing users, so it passed
/// on an empty database, exactly when docs/deploy.md starts the second
/// instance: a user registered through B could not bet through A. Now the
/// first process records the fingerprints of its seed and token secret in
/// the database, and a process with others refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_other_secrets_refuses_to_start_on_an_empty_database() {
    let env = Env::new(Db::Postgres).await;
    let a = env.start(&["--dev-block-interval", "0"]).await;
    let other_dir =
        std::env::temp_dir().join(format!("potluck_bb_b_{:016x}", rand::random::<u64>()));
    let b = env.beside(other_dir.clone());
    let (status, log) = b
        .run_to_exit(&["--admin-token", support::ADMIN, "--dev-block-interval", "0"])
        .await;
    assert!(
        !status.success(),
        "B started with another wallet seed on A's database: {log}"
    );
    assert!(
        log.contains("wallet.mnemonic"),
        "the refusal names the seed file: {log}"
    );
    // Same seed, other token secret: refused too, naming the token secret.
    std::fs::copy(
        env.data_dir.join("wallet.mnemonic"),
        other_dir.join("wallet.mnemonic"),
    )
    .unwrap();
    let (status, log) = b
        .run_to_exit(&["--admin-token", support::ADMIN, "--dev-block-interval", "0"])
        .await;
    assert!(
        !status.success(),
        "B started with another token secret: {log}"
    );
    assert!(
        log.contains("jwt-secret"),
        "the refusal names the token secret: {log}"
    );
    a.stop().await;
}

/// Issue 32 ("Also"): the shipped nginx configuration proxied `/admin/*` to
/// the world. It now serves it only to an allow-list, denying the rest.
#[test]
fn the_shipped_nginx_config_keeps_admin_to_an_allow_list() {
    let conf = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nginx/potluck.conf"),
    )
    .unwrap();
    let admin = conf
        .split("location /admin/ {")
        .nth(1)
        .expect("a location for /admin/")
        .split('}')
        .next()
        .unwrap();
    assert!(admin.contains("allow 127.0.0.1;"), "{admin}");
    assert!(admin.contains("deny all;"), "{admin}");
    assert!(admin.contains("proxy_pass http://potluck;"), "{admin}");
}
