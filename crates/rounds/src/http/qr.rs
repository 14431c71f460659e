//! QR codes drawn by the server as SVG (the `qrcode` crate), for the deposit address on the dashboard.

use qrcode::render::svg;
use qrcode::{EcLevel, QrCode};

/// Longest text drawn (a bitcoin URI with an address and an amount fits easily).
pub const MAX_QR_TEXT: usize = 256;

/// Why a QR code was not drawn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QrError {
    /// The text is longer than [`MAX_QR_TEXT`].
    #[error("text of {0} bytes is too long for a QR code here")]
    TooLong(usize),
    /// The encoder refused the text.
    #[error(transparent)]
    Encode(#[from] qrcode::types::QrError),
}

/// `text` as an SVG QR code (error correction M, quiet zone included,
/// black on white, at least 148 px so the dashboard's box is filled).
///
/// # Errors
/// [`QrError`] when the text is too long.
pub fn svg(text: &str) -> Result<String, QrError> {
    if text.len() > MAX_QR_TEXT {
        return Err(QrError::TooLong(text.len()));
    }
    let code = QrCode::with_error_correction_level(text.as_bytes(), EcLevel::M)?;
    Ok(code
        .render::<svg::Color<'_>>()
        .min_dimensions(148, 148)
        .dark_color(svg::Color("#000000"))
        .light_color(svg::Color("#ffffff"))
        .quiet_zone(true)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_an_svg_and_refuses_long_text() {
        let s = svg("bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080").unwrap();
        assert!(s.starts_with("<?xml") || s.starts_with("<svg"), "{s}");
        assert!(s.contains("</svg>"));
        assert!(matches!(svg(&"x".repeat(257)), Err(QrError::TooLong(257))));
    }
}
