//! The in-process API server's request decoding: path, query, content type and body of every
//! verb. The input is one or more requests, separated by a line `---`, each
//! `METHOD URI\nCONTENT-TYPE\nBODY` (an empty content-type line sends none), sent in order to a
//! new server, so a later request can read or change what an earlier one created.
#![no_main]

use ccm_testing::apiserver::fuzzing::{FuzzServer, INTENDED_INTERNAL_ERROR};
use libfuzzer_sys::fuzz_target;

fn send(server: &FuzzServer, data: &[u8]) {
    let Some(newline) = data.iter().position(|b| *b == b'\n') else {
        return;
    };
    let Ok(request_line) = std::str::from_utf8(&data[..newline]) else {
        return;
    };
    let rest = &data[newline + 1..];
    let (content_type, body) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (std::str::from_utf8(&rest[..i]).ok(), &rest[i + 1..]),
        None => (None, rest),
    };
    let content_type = content_type.filter(|c| !c.is_empty());
    let Some((method, uri)) = request_line.split_once(' ') else {
        return;
    };
    // A watch's stream is never read: the answer comes at once.
    if let Some(answer) = server.request(method, uri, content_type, body) {
        assert!((200..600).contains(&answer.status), "{}", answer.status);
        // kube-apiserver's own 500 (a create with resourceVersion set) is mirrored; any other
        // internal error is a bug.
        if answer.status == 500 {
            assert_eq!(
                answer.message.as_deref(),
                Some(INTENDED_INTERNAL_ERROR),
                "an internal error for {request_line:?}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let server = FuzzServer::new();
    let mut rest = data;
    for _ in 0..16 {
        let end = rest
            .windows(5)
            .position(|w| w == b"\n---\n")
            .unwrap_or(rest.len());
        send(&server, &rest[..end]);
        if end >= rest.len() {
            break;
        }
        rest = &rest[end + 5..];
    }
});
