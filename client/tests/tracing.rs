//! Every call runs in a `tally.call` span that a service's tracing pipeline
//! sees: operation, key length (or batch size), attempts, outcome and
//! latency, recorded also for a call whose future was dropped.

mod fake;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tally_client::{Client, ClientConfig, Code};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use fake::{spawn_fake_server, FakeServerHandle};

/// A closed span: its name and its fields as text.
#[derive(Clone, Debug)]
struct ClosedSpan {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl ClosedSpan {
    #[track_caller]
    fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("span {} has no field {name}: {:?}", self.name, self.fields))
    }
}

/// A layer that keeps every span's fields and hands them over on close.
#[derive(Clone, Default)]
struct Capture {
    open: Arc<Mutex<HashMap<Id, ClosedSpan>>>,
    closed: Arc<Mutex<Vec<ClosedSpan>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut span = ClosedSpan {
            name: attributes.metadata().name(),
            fields: BTreeMap::new(),
        };
        attributes.record(&mut Fields(&mut span.fields));
        self.open.lock().unwrap().insert(id.clone(), span);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().get_mut(id) {
            values.record(&mut Fields(&mut span.fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(span) = self.open.lock().unwrap().remove(&id) {
            self.closed.lock().unwrap().push(span);
        }
    }
}

impl Capture {
    /// The `tally.call` spans closed so far, oldest first.
    fn calls(&self) -> Vec<ClosedSpan> {
        self.closed
            .lock()
            .unwrap()
            .iter()
            .filter(|span| span.name == "tally.call")
            .cloned()
            .collect()
    }
}

/// Installs a capturing subscriber for this test's thread (a `#[tokio::test]`
/// runs its tasks, the client's coalescing task included, on that thread).
fn capture() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let guard = tracing::subscriber::set_default(subscriber);
    (capture, guard)
}

async fn client(server: &FakeServerHandle, coalescing: bool) -> Client {
    ClientConfig::new()
        .with_coalescing(coalescing)
        .with_backoff_base(Duration::from_millis(1))
        .with_backoff_max(Duration::from_millis(5))
        .connect(server.endpoint())
        .await
        .unwrap()
}

#[tokio::test]
async fn an_add_records_its_operation_key_length_attempts_outcome_and_latency() {
    let (capture, _guard) = capture();
    let server = spawn_fake_server().await;
    for coalescing in [false, true] {
        let client = client(&server, coalescing).await;
        server.node.fail_next_adds(2, Code::Unavailable);
        client.add("post:42:likes", 1).await.unwrap();
        let calls = capture.calls();
        let add = calls.last().expect("the add has a span");
        assert_eq!(add.field("operation"), "add", "coalescing {coalescing}");
        assert_eq!(add.field("key_len"), "13");
        assert_eq!(add.field("attempts"), "3", "coalescing {coalescing}");
        assert_eq!(add.field("outcome"), "ok");
        let latency: u64 = add.field("latency_us").parse().unwrap();
        assert!(latency > 0);
    }
}

#[tokio::test]
async fn failures_batches_and_node_calls_are_named() {
    let (capture, _guard) = capture();
    let server = spawn_fake_server().await;
    let client = client(&server, true).await;

    client.add("", 1).await.unwrap_err();
    server.node.fail_next_adds(1, Code::FailedPrecondition);
    client.add("k", 1).await.unwrap_err();
    client
        .add_batch([("a", 1), ("b", 2), ("c", 3)])
        .await
        .unwrap();
    client.get_batch(["a", "b"]).await.unwrap();
    client.get("a").await.unwrap();

    let calls = capture.calls();
    let summary: Vec<(&str, &str, Option<&String>)> = calls
        .iter()
        .map(|span| {
            (
                span.field("operation"),
                span.field("outcome"),
                span.fields.get("key_len").or(span.fields.get("items")),
            )
        })
        .collect();
    let text = |value: &str| Some(value.to_owned());
    assert_eq!(
        summary,
        [
            ("add", "invalid_argument", text("0").as_ref()),
            ("add", "server", text("1").as_ref()),
            ("add_batch", "ok", text("3").as_ref()),
            ("get_batch", "ok", text("2").as_ref()),
            ("get", "ok", text("1").as_ref()),
        ]
    );
    // Refused before sending: no attempt.
    assert!(!calls[0].fields.contains_key("attempts"));
    assert_eq!(calls[1].field("attempts"), "1");
}

#[tokio::test]
async fn a_dropped_call_is_recorded_as_cancelled() {
    let (capture, _guard) = capture();
    let server = spawn_fake_server().await;
    let client = client(&server, false).await;
    server.node.state().add_delay = Duration::from_secs(5);
    let gave_up = tokio::time::timeout(Duration::from_millis(50), client.add("slow", 1)).await;
    assert!(gave_up.is_err(), "the add should still be in flight");
    let calls = capture.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].field("outcome"), "cancelled");
    assert_eq!(calls[0].field("attempts"), "1");
    assert!(calls[0].fields.contains_key("latency_us"));
}
