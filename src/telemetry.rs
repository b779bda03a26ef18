//! Logging: one place that sets up tracing, JSON lines on stdout, and
//! how an error is written in a log line (with every error behind it).

use std::error::Error;
use std::fmt;

use tracing_subscriber::EnvFilter;

/// Installs the JSON log subscriber. `RUST_LOG` overrides the default
/// filter (`info`; `debug` adds a line per request).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(true)
        .with_span_list(false)
        .init();
}

/// An error and every error behind it, as one line of a log: "what: its
/// cause: that one's cause". The service's errors keep their causes as
/// sources and never repeat them in their own message, so nothing is lost
/// and nothing said twice: log an error as `error = %Chain(&error)`. (A
/// dependency's error may still quote its own source, as sqlx's I/O error
/// does: a cause whose text its error's already ends with is skipped.)
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        f.write_str(&said)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !said.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            said = text;
            next = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the sale")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("Redis failed a command")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn a_chain_says_each_error_once_outermost_first() {
        let error = Outer(Middle(std::io::Error::other("connection refused")));
        assert_eq!(
            Chain(&error).to_string(),
            "the sale: Redis failed a command: connection refused"
        );
        let alone = std::io::Error::other("alone");
        assert_eq!(Chain(&alone).to_string(), "alone");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("error communicating with the database: {0}")]
    struct Quoting(#[source] std::io::Error);

    #[test]
    fn a_cause_its_error_already_quotes_is_not_said_again() {
        let quoting = Quoting(std::io::Error::other("connection refused"));
        assert_eq!(
            Chain(&quoting).to_string(),
            "error communicating with the database: connection refused"
        );
    }
}
