//! `ucm replay --requests FILE`: a workload given as the requests an
//! engine served, so that the replay predicts what UCM serves them (for
//! example `scripts/serve_bench.py`'s requests, to set the real engine's
//! hits against the replay's). One JSON object per line, in arrival order:
//! `{"session": S, "turn": T, "prompt": [token ids], "output": [token ids]}`
//! (`output`, what the engine generated, may be empty). Every size is
//! bounded and every fault names its line, so a hostile file is an error,
//! never an unbounded allocation.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::WorkRequest;

/// Most requests read from one file.
pub const MAX_REQUESTS: usize = 1_000_000;
/// Most tokens in one prompt plus its output.
pub const MAX_TOKENS: usize = 10_000_000;
/// Longest line read (bytes): 10M token ids of up to 10 digits fit.
pub const MAX_LINE: usize = 1 << 27;

/// Why a request file cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum RequestsError {
    /// The file cannot be read.
    #[error("cannot read the requests: {0}")]
    Io(#[from] std::io::Error),
    /// One line is wrong.
    #[error("requests line {line}: {why}")]
    Line {
        /// The line (from 1).
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// No request at all.
    #[error("the file holds no request")]
    Empty,
    /// More than [`MAX_REQUESTS`].
    #[error("the file holds more than {MAX_REQUESTS} requests")]
    TooMany,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    session: usize,
    turn: usize,
    prompt: Vec<u32>,
    #[serde(default)]
    output: Vec<u32>,
}

/// Reads a request file (see the module).
pub fn read_requests(path: &Path) -> Result<Vec<WorkRequest>, RequestsError> {
    parse(std::fs::File::open(path)?)
}

/// Reads requests from `r` (see the module).
pub fn parse(r: impl Read) -> Result<Vec<WorkRequest>, RequestsError> {
    let mut reader = BufReader::new(r);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0;
    loop {
        buf.clear();
        // One byte past the limit tells a line that is too long.
        let n = (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        line += 1;
        let bad = |why: String| RequestsError::Line { line, why };
        if buf.len() > MAX_LINE {
            return Err(bad(format!("longer than {MAX_LINE} bytes")));
        }
        let text = std::str::from_utf8(&buf).map_err(|_| bad("not UTF-8".into()))?;
        if text.trim().is_empty() {
            continue;
        }
        let raw: Raw = serde_json::from_str(text).map_err(|e| {
            let mut m = e.to_string();
            m.truncate(200);
            bad(m)
        })?;
        if raw.prompt.is_empty() {
            return Err(bad("an empty prompt".into()));
        }
        if raw.prompt.len() + raw.output.len() > MAX_TOKENS {
            return Err(bad(format!("more than {MAX_TOKENS} tokens")));
        }
        if out.len() == MAX_REQUESTS {
            return Err(RequestsError::TooMany);
        }
        out.push(WorkRequest {
            session: raw.session,
            turn: raw.turn,
            tokens: Arc::new(raw.prompt),
            output: Arc::new(raw.output),
        });
    }
    if out.is_empty() {
        return Err(RequestsError::Empty);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_in_order_with_their_outputs() {
        let text = "{\"session\":0,\"turn\":0,\"prompt\":[1,2,3],\"output\":[4]}\n\n\
                    {\"session\":1,\"turn\":2,\"prompt\":[5]}\n";
        let r = parse(text.as_bytes()).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].session, r[0].turn), (0, 0));
        assert_eq!(*r[0].tokens, vec![1, 2, 3]);
        assert_eq!(*r[0].output, vec![4]);
        assert_eq!((r[1].session, r[1].turn), (1, 2));
        assert!(r[1].output.is_empty());
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        for (text, want) in [
            (
                "{\"session\":0,\"turn\":0,\"prompt\":[]}",
                "line 1: an empty prompt",
            ),
            (
                "\n{\"session\":0,\"turn\":0}",
                "line 2: missing field `prompt`",
            ),
            (
                "{\"session\":0,\"turn\":0,\"prompt\":[1],\"x\":1}",
                "line 1: unknown field",
            ),
            (
                "{\"session\":0,\"turn\":0,\"prompt\":[-1]}",
                "line 1: invalid value",
            ),
            ("\u{0}\u{ff}", "line 1"),
        ] {
            let e = parse(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        assert!(matches!(parse(&b"\n\n"[..]), Err(RequestsError::Empty)));
        let long = vec![b' '; MAX_LINE + 10];
        let e = parse(&long[..]).unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");
    }
}
