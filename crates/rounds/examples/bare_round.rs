//! Benchmark baseline: a bare axum server answering GET /rounds/current with a fixed round JSON of the same shape, no database, no auth, no middleware.
//!
//! `cargo run --release -p potluck-rounds --example bare_round -- 127.0.0.1:18081`

use axum::routing::get;
use axum::{Json, Router};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18081".into());
    let body = serde_json::json!({
        "id": 1, "status": "open", "opened_at": "2026-11-21T17:00:00Z", "closes_at": "2026-11-21T17:02:00Z",
        "pot_sats": 0, "bettors": 0, "user_played": false, "paused": false, "draw": null, "payout": null
    });
    let app = Router::new().route(
        "/rounds/current",
        get(move || {
            let b = body.clone();
            async move { Json(b) }
        }),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("bare_round listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await
}
