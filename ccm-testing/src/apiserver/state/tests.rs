//! The store's sharing: one object, one allocation, wherever it is held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{ListOptions, PatchType, State};
use crate::apiserver::resources::{ResourceInfo, lookup};
use crate::apiserver::status::ApiError;

fn configmaps() -> &'static ResourceInfo {
    lookup("", "v1", "configmaps").unwrap()
}

fn state_with(names: &[&str]) -> State {
    let mut s = State::new(100);
    for name in names {
        let obj = json!({"metadata": {"name": name, "labels": {"app": "x"}}, "data": {"k": "v"}});
        s.create(configmaps(), Some("default"), obj, "test", false)
            .unwrap();
    }
    s
}

#[test]
fn the_store_the_history_and_a_list_hold_the_same_object() {
    let mut s = state_with(&["a"]);
    let info = configmaps();
    let created = s.get_shared(info, Some("default"), "a").unwrap();
    let added = s.history.back().unwrap().clone();
    assert!(Arc::ptr_eq(&added.object, &created));
    s.patch(
        info,
        Some("default"),
        "a",
        None,
        PatchType::Merge,
        json!({"data": {"k": "w"}}),
        "test",
        false,
        false,
    )
    .unwrap();
    let patched = s.get_shared(info, Some("default"), "a").unwrap();
    let modified = s.history.back().unwrap().clone();
    assert!(Arc::ptr_eq(&modified.object, &patched));
    // The old object of the change is the version the store held before, not a copy.
    assert!(Arc::ptr_eq(modified.old.as_ref().unwrap(), &created));
    assert_eq!(patched.value()["data"]["k"], "w");
    let page = s
        .list(info, Some("default"), &ListOptions::default())
        .unwrap();
    assert!(Arc::ptr_eq(&page.items[0], &patched));
    // A watch from the start is queued with the shared object, not a serialised copy.
    let (initial, _rx, _) = s
        .watch(info, Some("default"), &ListOptions::default(), None, true)
        .unwrap();
    assert!(Arc::ptr_eq(&initial[0].1, &patched));
}

#[test]
fn a_continue_token_expires_after_five_minutes() {
    let mut s = state_with(&["a", "b", "c"]);
    let info = configmaps();
    let first = ListOptions {
        limit: Some(1),
        ..ListOptions::default()
    };
    let page = s.list(info, Some("default"), &first).unwrap();
    let (token, remaining) = page.more.clone().unwrap();
    assert_eq!(remaining, 2);
    let next = ListOptions {
        limit: Some(1),
        continue_token: Some(token.clone()),
        ..ListOptions::default()
    };
    let second = s.list(info, Some("default"), &next).unwrap();
    assert_eq!(second.items[0].name(), "b");
    // Kept 5 minutes (etcd's compaction interval), then 410 Gone.
    for snap in s.snapshots.values_mut() {
        snap.taken = Instant::now()
            .checked_sub(Duration::from_secs(301))
            .unwrap();
    }
    let e: ApiError = s.list(info, Some("default"), &next).unwrap_err();
    assert_eq!(e.code, 410);
    assert!(s.snapshots.is_empty());
}
