//! What an upload's headers say about its body and its file, shared by
//! the API's `PUT /v1/sandboxes/{id}/files` and the E2B door's
//! `POST /files`:
//!
//! - `Content-Encoding: gzip` (or `x-gzip`): the body is gzip data (one or
//!   more members, as `cat a.gz b.gz` makes), decoded as it streams in: the
//!   file holds the decoded bytes. `identity` or none: the bytes as they
//!   come. Any other encoding is refused before a byte is written.
//! - `X-Metadata-<key>: <value>`: the file's metadata (E2B's headers; keys
//!   are lowercased when stored, see `sandtree_runtime::checked_metadata`).
//!
//! A gzip body is decoded at most [`DECODE_STEP`] input bytes at a time, so
//! that a small body of highly compressible data never swells into one
//! huge buffer (gzip expands at most about 1,000 times: each step yields a
//! few MiB at most).

use std::collections::BTreeMap;
use std::io::Write;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::HeaderMap;
use flate2::write::MultiGzDecoder;
use futures_util::{Stream, StreamExt};

/// Header prefix of a file's metadata.
pub const METADATA_HEADER_PREFIX: &str = "x-metadata-";
/// Input bytes decoded at a time.
const DECODE_STEP: usize = 4096;

/// The metadata an upload's `X-Metadata-*` headers give its file.
pub fn metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else { continue };
        let value = value
            .to_str()
            .map_err(|_| format!("file metadata value of {key:?}: at most 4096 printable ASCII characters"))?;
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

/// `req` with its body decoded as its `Content-Encoding` says.
pub fn decoded(req: Request) -> Result<Request, String> {
    let encoding = req.headers().get("content-encoding").map(|e| e.to_str().unwrap_or("?").trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("" | "identity") => Ok(req),
        Some("gzip" | "x-gzip") => {
            let (mut parts, body) = req.into_parts();
            parts.headers.remove("content-encoding");
            parts.headers.remove("content-length");
            Ok(Request::from_parts(parts, Body::from_stream(gunzip(body.into_data_stream()))))
        }
        Some(other) => Err(format!(
            "Content-Encoding {other:?} is not supported for uploads (send gzip, or the bytes as they are)"
        )),
    }
}

/// Where a gunzip stream is.
struct Gunzip<S> {
    body: S,
    decoder: MultiGzDecoder<Vec<u8>>,
    /// Input received and not decoded yet.
    pending: Bytes,
    ended: bool,
}

/// The decoded bytes of gzip data `body`; an error at the first byte that
/// is not gzip data, or at the end if the data stops short.
pub fn gunzip<S, E>(body: S) -> impl Stream<Item = Result<Bytes, String>>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let start = Gunzip { body, decoder: MultiGzDecoder::new(Vec::new()), pending: Bytes::new(), ended: false };
    futures_util::stream::unfold(start, |mut g| async move {
        if g.ended {
            return None;
        }
        loop {
            if g.pending.is_empty() {
                match g.body.next().await {
                    Some(Ok(chunk)) => {
                        g.pending = chunk;
                        continue;
                    }
                    Some(Err(e)) => {
                        g.ended = true;
                        return Some((Err(e.to_string()), g));
                    }
                    None => {
                        g.ended = true;
                        let end = g.decoder.try_finish().map_err(|e| format!("the gzip data stops short ({e})"));
                        let out = std::mem::take(g.decoder.get_mut());
                        return match end {
                            Err(e) => Some((Err(e), g)),
                            Ok(()) if out.is_empty() => None,
                            Ok(()) => Some((Ok(Bytes::from(out)), g)),
                        };
                    }
                }
            }
            let step = g.pending.split_to(g.pending.len().min(DECODE_STEP));
            if let Err(e) = g.decoder.write_all(&step) {
                g.ended = true;
                return Some((Err(format!("the body is not gzip data ({e})")), g));
            }
            let out = std::mem::take(g.decoder.get_mut());
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), g));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gz(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    async fn decode(chunks: Vec<Vec<u8>>) -> Result<Vec<u8>, String> {
        let body = futures_util::stream::iter(chunks.into_iter().map(|c| Ok::<_, String>(Bytes::from(c))));
        let mut s = std::pin::pin!(gunzip(body));
        let mut out = Vec::new();
        while let Some(chunk) = s.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn gzip_bodies_are_decoded_in_any_chunking_and_members() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let packed = gz(&data);
        assert_eq!(decode(vec![packed.clone()]).await.unwrap(), data);
        assert_eq!(decode(packed.chunks(7).map(<[u8]>::to_vec).collect()).await.unwrap(), data);
        // Two members, as `cat a.gz b.gz`.
        let two = [gz(b"first "), gz(b"second")].concat();
        assert_eq!(decode(vec![two]).await.unwrap(), b"first second");
        assert_eq!(decode(vec![gz(b"")]).await.unwrap(), b"");
    }

    #[tokio::test]
    async fn broken_gzip_bodies_are_errors() {
        let packed = gz(b"some text that is long enough to be cut somewhere");
        let cut = packed[..packed.len() - 6].to_vec();
        let e = decode(vec![cut]).await.unwrap_err();
        assert!(e.contains("stops short"), "{e}");
        let e = decode(vec![b"plain text, not gzip".to_vec()]).await.unwrap_err();
        assert!(e.contains("not gzip"), "{e}");
    }

    #[test]
    fn metadata_comes_from_x_metadata_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-metadata-owner", "me".parse().unwrap());
        h.insert(axum::http::HeaderName::from_bytes(b"X-Metadata-Run-Id").unwrap(), "7".parse().unwrap());
        h.insert("x-other", "no".parse().unwrap());
        let m = metadata(&h).unwrap();
        assert_eq!(m.into_iter().collect::<Vec<_>>(), [("owner".into(), "me".into()), ("run-id".into(), "7".into())]);
    }
}
