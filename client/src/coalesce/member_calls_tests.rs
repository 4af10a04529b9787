//! Tests of the member-call coalescer's queue and answers (no I/O).

use super::*;

fn ask(
    queue: &mut MemberQueue,
    key: &str,
    members: &[&str],
    timeout_ms: u64,
) -> oneshot::Receiver<CallAnswer> {
    let (reply, reply_rx) = oneshot::channel();
    queue.push(PendingCall {
        key: Bytes::copy_from_slice(key.as_bytes()),
        members: members
            .iter()
            .map(|m| Bytes::copy_from_slice(m.as_bytes()))
            .collect(),
        timeout: Duration::from_millis(timeout_ms),
        reply,
    });
    reply_rx
}

fn members(call: &MemberBatch) -> Vec<&[u8]> {
    call.request.members.iter().map(|m| &m[..]).collect()
}

#[test]
fn callers_of_one_set_share_a_call_and_each_gets_its_own_answers() {
    let mut queue = MemberQueue::default();
    let mut sam = ask(&mut queue, "post:1", &["sam"], 50);
    let mut pair = ask(&mut queue, "post:1", &["bo", "cy"], 80);
    let _other = ask(&mut queue, "post:2", &["sam"], 10);
    let call = queue.take_call().expect("a call");
    assert_eq!(&call.request.key[..], b"post:1");
    assert_eq!(members(&call), [&b"sam"[..], b"bo", b"cy"]);
    assert_eq!(call.timeout, Duration::from_millis(80), "the longest wait");
    answer(
        call.waiters,
        3,
        Ok(MemberAnswer::Liked(vec![true, false, true])),
    );
    assert_eq!(
        sam.try_recv().unwrap().unwrap(),
        MemberAnswer::Liked(vec![true])
    );
    assert_eq!(
        pair.try_recv().unwrap().unwrap(),
        MemberAnswer::Liked(vec![false, true])
    );
    let next = queue.take_call().expect("the other set's call");
    assert_eq!(&next.request.key[..], b"post:2");
    assert!(queue.take_call().is_none());
    assert!(queue.is_empty());
}

#[test]
fn a_call_holds_at_most_the_nodes_limit_and_the_rest_goes_next() {
    let mut queue = MemberQueue::default();
    let big: Vec<String> = (0..MAX_MEMBERS - 1).map(|i| format!("m{i}")).collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    let _first = ask(&mut queue, "post:1", &big, 10);
    let _second = ask(&mut queue, "post:1", &["a", "b"], 10);
    let _third = ask(&mut queue, "post:1", &["c"], 10);
    let call = queue.take_call().expect("a call");
    assert_eq!(call.request.members.len(), MAX_MEMBERS);
    assert_eq!(call.waiters.len(), 2, "the first and the third fit");
    let next = queue.take_call().expect("the rest");
    assert_eq!(members(&next), [&b"a"[..], b"b"]);
    assert!(queue.take_call().is_none());
    // One caller over the limit goes alone, and the node says why.
    let too_many: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("m{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let _alone = ask(&mut queue, "post:1", &too_many, 10);
    assert_eq!(queue.take_call().unwrap().waiters.len(), 1);
}

#[test]
fn a_caller_that_went_away_is_not_asked_about() {
    let mut queue = MemberQueue::default();
    drop(ask(&mut queue, "post:1", &["gone"], 10));
    let _kept = ask(&mut queue, "post:1", &["kept"], 10);
    let call = queue.take_call().expect("a call");
    assert_eq!(members(&call), [&b"kept"[..]]);
    drop(ask(&mut queue, "post:2", &["gone"], 10));
    assert!(queue.take_call().is_none());
    assert!(queue.is_empty());
}

#[test]
fn an_error_or_a_short_answer_reaches_every_waiter() {
    let mut queue = MemberQueue::default();
    let mut first = ask(&mut queue, "post:1", &["a"], 10);
    let mut second = ask(&mut queue, "post:1", &["b"], 10);
    let call = queue.take_call().unwrap();
    answer(call.waiters, 2, Ok(MemberAnswer::Liked(vec![true])));
    for reply in [&mut first, &mut second] {
        let status = reply.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().contains("1 flags to a `liked` call of 2"));
    }
    let mut third = ask(&mut queue, "post:1", &["c"], 10);
    let call = queue.take_call().unwrap();
    answer(
        call.waiters,
        1,
        Err(Status::invalid_argument("member too long")),
    );
    let status = third.try_recv().unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[test]
fn every_observer_of_a_key_gets_the_estimate_after_the_call() {
    let mut queue = MemberQueue::default();
    let mut first = ask(&mut queue, "video:1", &["a", "b"], 10);
    let mut second = ask(&mut queue, "video:1", &["c"], 10);
    let call = queue.take_call().unwrap();
    assert_eq!(members(&call), [&b"a"[..], b"b", b"c"]);
    answer(call.waiters, 3, Ok(MemberAnswer::Estimate(41)));
    assert_eq!(
        first.try_recv().unwrap().unwrap(),
        MemberAnswer::Estimate(41)
    );
    assert_eq!(
        second.try_recv().unwrap().unwrap(),
        MemberAnswer::Estimate(41)
    );
}
