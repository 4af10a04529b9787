//! An add that is counted once however often it is sent: a caller-chosen
//! idempotency key, the client's own retries, and the caller's retry of a
//! call whose outcome it could not learn.
//!
//! ```sh
//! cargo run -p tally-node -- dev                       # in another terminal
//! cargo run -p tally-client --example add_with_retries -- http://127.0.0.1:7100
//! ```

use std::time::Duration;

use tally_client::{ClientConfig, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:7100".to_owned());
    // Up to 5 retries of transient failures, with backoff from 50 ms, all
    // within 2 s per call.
    let client = ClientConfig::new()
        .with_deadline(Duration::from_secs(2))
        .with_max_retries(5)
        .with_backoff_base(Duration::from_millis(50))
        .connect_lazy(endpoint)?;

    // The key names the logical add: here, order 42 bought one item. Made
    // once, before the first try, and reused by every try.
    let idempotency_key = "order-42:sold:item-7";
    let mut tries = 0;
    let outcome = loop {
        tries += 1;
        match client.add_with_key("item-7:sold", 1, idempotency_key).await {
            Ok(outcome) => break outcome,
            // Unavailable or timed out after the client's own retries: the add
            // may or may not have been applied. Sending it again with the same
            // key is safe: the node counts it once.
            Err(error) if error.is_transient() && tries < 3 => {
                eprintln!("try {tries} failed ({error}); trying again with the same key");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    };
    println!(
        "item-7:sold = {} ({})",
        outcome.value,
        if outcome.duplicate {
            "this key had already been applied: nothing was added"
        } else {
            "added now"
        }
    );

    // Sending the very same add again changes nothing.
    let again = client
        .add_with_key("item-7:sold", 1, idempotency_key)
        .await?;
    assert!(again.duplicate);
    println!(
        "sent again: still {}, duplicate = {}",
        again.value, again.duplicate
    );
    Ok(())
}
