#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn webhook(limits: Limits) -> Webhook {
    Webhook::new(
        Templates::new(),
        CertificateStore::new(),
        Registry::default(),
        limits,
    )
}

#[tokio::test]
async fn a_reservation_waits_for_the_budget_and_gives_up_after_the_request_timeout() {
    let webhook = webhook(Limits {
        memory_budget_bytes: 1024 * 1024,
        request_timeout: Duration::from_millis(200),
        ..Limits::default()
    });
    // The largest body takes the whole budget, and decodes within what is left of it.
    let largest = webhook.reserve(3 * 1024 * 1024).await.unwrap();
    assert_eq!(largest.allowance, 0);
    let small = webhook.reserve(1024);
    assert!(small.await.is_none(), "the budget is taken");
    drop(largest);

    let small = webhook.reserve(1024).await.unwrap();
    assert_eq!(small.allowance, pod_json::MIN_ALLOWANCE);
    // Reservations add up to the budget, no more.
    let mut held = vec![small];
    while let Some(more) = tokio::time::timeout(Duration::from_millis(50), webhook.reserve(1024))
        .await
        .ok()
        .flatten()
    {
        held.push(more);
    }
    let per_request = 1024 + pod_json::MIN_ALLOWANCE;
    assert_eq!(held.len(), 1024 * 1024 / per_request);
}
