//! The dashboard: a plain HTML/CSS/JS page compiled into the binary, served at `/` with its assets under `/assets/`.
//!
//! No build step and nothing fetched at run time: the files in
//! `crates/rounds/assets/` are embedded with `include_str!`. The page routes
//! with the URL fragment, so the server knows only `/` and the asset names;
//! every other path stays a structured 404 (`not_found`).

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use crate::http::error::ApiError;

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// Every file of the page; `index.html` is served at `/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../../assets/index.html"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../../assets/app.css"),
    },
    Asset {
        name: "i18n.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../assets/i18n.js"),
    },
    Asset {
        name: "draw.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../assets/draw.js"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../assets/app.js"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_str!("../../assets/favicon.svg"),
    },
];

/// The page may load only its own scripts and styles and talk only to this
/// origin; nothing inline, no frames. QR codes and the favicon are SVG.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Total bytes of the page's first load (every asset once), for the size budget.
pub fn first_load_bytes() -> usize {
    ASSETS.iter().map(|a| a.body.len()).sum()
}

/// Strong ETags, computed once: the files only change with the binary.
fn etag(index: usize) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.body.as_bytes());
                format!("\"{}\"", hex::encode(&digest[..12]))
            })
            .collect()
    })
    .get(index)
    .map_or("\"\"", String::as_str)
}

fn serve(index: usize, request: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.get(index) else {
        return ApiError::NotFound.into_response();
    };
    let tag = etag(index);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    // `no-cache` = revalidate every time: an upgraded binary is picked up at
    // once, while an unchanged asset costs a 304 without a body.
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::ETAG,
            HeaderValue::from_str(tag).unwrap_or(HeaderValue::from_static("\"\"")),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
    ];
    if fresh {
        (StatusCode::NOT_MODIFIED, headers).into_response()
    } else {
        (headers, asset.body).into_response()
    }
}

async fn index(request: HeaderMap) -> Response {
    serve(0, &request)
}

async fn asset(Path(name): Path<String>, request: HeaderMap) -> Response {
    match ASSETS.iter().position(|a| a.name == name) {
        Some(i) => serve(i, &request),
        None => ApiError::NotFound.into_response(),
    }
}

/// `/` and `/assets/{name}`; kept out of the OpenAPI document (not API).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_load_is_under_the_200_kb_budget() {
        assert!(first_load_bytes() < 200 * 1024, "{}", first_load_bytes());
    }

    #[test]
    fn every_script_and_style_the_page_names_is_embedded() {
        let html = ASSETS[0].body;
        for part in html.split("/assets/").skip(1) {
            let name: String = part
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
                .collect();
            assert!(
                ASSETS.iter().any(|a| a.name == name),
                "index.html names /assets/{name}, which is not embedded"
            );
        }
        assert!(!html.contains("<script>"), "no inline script (CSP)");
        assert!(!html.contains("style=\""), "no inline style (CSP)");
    }
}
