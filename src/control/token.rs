//! The channel's leaves: the API's version, the control file's name, the access token's
//! rules and its constant-time comparison, the `InvalidOption` its checks return.

use crate::{Error, Result};

/// The version of the JSON API and of the control file.
pub const API_VERSION: u32 = 1;
/// What a queue file's name ends with to make its control file's ([`control_file_path`](super::control_file_path)).
pub const CONTROL_FILE_SUFFIX: &str = "-control";
/// Bytes of an access token given to [`Control::token`](super::Control::token): at least this many.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Bytes of an access token given to [`Control::token`](super::Control::token): at most this many.
pub const TOKEN_BYTES_MAX: usize = 128;

/// `InvalidOption` for `field` (built from the public variant: the channel uses the public
/// API only).
pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidOption {
        field,
        reason: reason.into(),
    }
}

/// A token given by the app, checked against [`Control::token`](super::Control::token)'s rules.
pub(crate) fn validate_token(token: String) -> Result<String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&token.len()) || !token.chars().all(ok_char) {
        return Err(invalid(
            "token",
            format!("{TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX} ASCII letters, digits, '-' or '_'"),
        ));
    }
    Ok(token)
}

/// 128 bits from the system's generator, as 32 hex digits.
pub(crate) fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Io(std::io::Error::other(format!("no random bytes: {e}"))))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two tokens in time that depends on their lengths only.
pub(crate) fn same(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}
