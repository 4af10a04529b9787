//! Membership over chitchat: real UDP on loopback, and chitchat's in-memory
//! transport where a partition or a restart on the same address is needed.
//!
//! Every wait polls every 50 ms and gives up after 20 s; no test asserts a
//! duration (elapsed times are printed, see `--nocapture`). Each test shuts
//! down what it spawned, and the test runtime's end stops anything left.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use chitchat::transport::ChannelTransport;
use futures::future::join_all;
use tally_node::crdt::ReplicaId;
use tally_node::gossip::membership::{MembershipConfig, MembershipHandle};
use tally_node::replica::Member;
use tokio::time::{sleep, timeout, Instant};

const CLUSTER: &str = "tally-test";
const GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
const POLL: Duration = Duration::from_millis(50);
const GIVE_UP: Duration = Duration::from_secs(20);

/// A loopback UDP address that was free a moment ago (chitchat cannot bind
/// port 0 and report the port back).
fn free_udp_addr() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind a probe socket");
    socket.local_addr().expect("probe socket address")
}

/// What a node is expected to publish.
#[derive(Clone, Debug)]
struct Spec {
    cluster: &'static str,
    name: &'static str,
    region: &'static str,
    replica: ReplicaId,
    gossip: SocketAddr,
}

impl Spec {
    fn new(name: &'static str, region: &'static str, replica: u64, gossip: SocketAddr) -> Spec {
        Spec {
            cluster: CLUSTER,
            name,
            region,
            replica: ReplicaId(replica),
            gossip,
        }
    }

    fn grpc_addr(&self) -> String {
        format!("127.0.0.1:{}", 20_000 + self.replica.0)
    }

    fn config(&self, seeds: &[&Spec]) -> MembershipConfig {
        MembershipConfig {
            cluster_id: self.cluster.to_string(),
            node_name: self.name.to_string(),
            region: self.region.to_string(),
            replica: self.replica,
            gossip_listen: self.gossip,
            gossip_advertise: self.gossip,
            grpc_advertise: self.grpc_addr(),
            seeds: seeds.iter().map(|seed| seed.gossip.to_string()).collect(),
            gossip_interval: GOSSIP_INTERVAL,
            protocol: Default::default(),
            partitions: 256,
            born_at: tally_node::replica::version::NEWEST,
            holding: None,
            state: None,
        }
    }

    async fn spawn_udp(&self, seeds: &[&Spec]) -> MembershipHandle {
        MembershipHandle::spawn(self.config(seeds))
            .await
            .unwrap_or_else(|error| panic!("spawn {}: {error:#}", self.name))
    }

    async fn spawn_in(&self, transport: &ChannelTransport, seeds: &[&Spec]) -> MembershipHandle {
        MembershipHandle::spawn_with_transport(self.config(seeds), transport)
            .await
            .unwrap_or_else(|error| panic!("spawn {}: {error:#}", self.name))
    }

    /// The member, as listed in `members`, if it carries what this node
    /// publishes.
    fn find<'a>(&self, members: &'a [Member]) -> Option<&'a Member> {
        members.iter().find(|member| {
            member.replica == self.replica
                && member.node_name == self.name
                && member.region == self.region
                && member.grpc_addr == self.grpc_addr()
                && member.gossip_addr == self.gossip.to_string()
        })
    }

    fn is_alive_in(&self, members: &[Member]) -> bool {
        self.find(members).is_some_and(|member| member.alive)
    }

    fn is_down_in(&self, members: &[Member]) -> bool {
        !self.is_alive_in(members)
    }
}

/// Polls `handle.members()` until `done` holds; panics with the last view
/// after [`GIVE_UP`].
async fn wait_until(
    what: &str,
    handle: &MembershipHandle,
    done: impl Fn(&[Member]) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let members = handle.members();
        if done(&members) {
            let elapsed = start.elapsed();
            eprintln!("{what}: after {elapsed:?}");
            return elapsed;
        }
        if start.elapsed() > GIVE_UP {
            panic!("{what}: still not true after {GIVE_UP:?}; last view: {members:#?}");
        }
        sleep(POLL).await;
    }
}

/// Waits until every node sees every other one alive, and nothing else.
async fn wait_for_full_mesh(nodes: &[(&Spec, &MembershipHandle)]) {
    for (spec, handle) in nodes {
        let others: Vec<&Spec> = nodes
            .iter()
            .map(|(other, _)| *other)
            .filter(|other| other.name != spec.name)
            .collect();
        let what = format!("{} sees {} others alive", spec.name, others.len());
        wait_until(&what, handle, |members| {
            members.len() == others.len() && others.iter().all(|other| other.is_alive_in(members))
        })
        .await;
    }
}

/// Shuts the nodes down together (each leave waits up to a few rounds).
async fn shutdown_all<const N: usize>(handles: [MembershipHandle; N]) {
    for result in join_all(handles.map(MembershipHandle::shutdown)).await {
        result.expect("clean shutdown");
    }
}

#[tokio::test]
async fn three_regions_see_each_other_and_the_published_values() {
    let eu = Spec::new("eu-1", "eu", 0x1111_0000_0000_0001, free_udp_addr());
    let us = Spec::new("us-1", "us", 0x2222_0000_0000_0002, free_udp_addr());
    let ap = Spec::new("ap-1", "ap", 0x3333_0000_0000_0003, free_udp_addr());
    let eu_handle = eu.spawn_udp(&[]).await;
    let us_handle = us.spawn_udp(&[&eu]).await;
    let ap_handle = ap.spawn_udp(&[&eu]).await;

    wait_for_full_mesh(&[(&eu, &eu_handle), (&us, &us_handle), (&ap, &ap_handle)]).await;
    for handle in [&eu_handle, &us_handle, &ap_handle] {
        assert!(handle.members().iter().all(|m| m.durable_seq == 0));
    }

    let mut ap_rx = ap_handle.subscribe();
    assert!(eu_handle
        .members()
        .iter()
        .all(|m| m.counters_stored.is_none()));
    us_handle.publish(7, 0xabc, 0x5e7, Some(42));
    let published = |members: &[Member]| {
        us.find(members).is_some_and(|m| {
            m.alive
                && m.durable_seq == 7
                && m.digest == 0xabc
                && m.sets_digest == Some(0x5e7)
                && m.counters_stored == Some(42)
        })
    };
    wait_until("eu sees us's publication", &eu_handle, published).await;
    wait_until("ap sees us's publication", &ap_handle, published).await;
    timeout(GIVE_UP, ap_rx.wait_for(|members| published(members)))
        .await
        .expect("ap's subscription shows us's publication in time")
        .expect("ap's membership is still running");
    let eu_view = eu_handle.members();
    assert!(ap.find(&eu_view).is_some_and(|m| m.durable_seq == 0));

    shutdown_all([eu_handle, us_handle, ap_handle]).await;
}

#[tokio::test]
async fn a_node_of_another_cluster_is_refused() {
    let a = Spec::new("a", "eu", 0xa, free_udp_addr());
    let b = Spec::new("b", "us", 0xb, free_udp_addr());
    let intruder = Spec {
        cluster: "another-cluster",
        ..Spec::new("intruder", "ap", 0xc, free_udp_addr())
    };
    let a_handle = a.spawn_udp(&[]).await;
    let intruder_handle = intruder.spawn_udp(&[&a]).await;
    let b_handle = b.spawn_udp(&[&a]).await;

    // Gossip works meanwhile: b, seeded at a as the intruder is, gets in.
    wait_for_full_mesh(&[(&a, &a_handle), (&b, &b_handle)]).await;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        for (name, handle) in [("a", &a_handle), ("b", &b_handle)] {
            let members = handle.members();
            assert!(
                members.iter().all(|m| m.node_name != intruder.name),
                "{name} lists the intruder: {members:#?}"
            );
        }
        let intruder_view = intruder_handle.members();
        assert!(
            intruder_view.is_empty(),
            "the intruder sees {intruder_view:#?}"
        );
        sleep(POLL).await;
    }

    shutdown_all([a_handle, b_handle, intruder_handle]).await;
}

#[tokio::test]
async fn a_node_that_shuts_down_is_no_longer_alive() {
    let eu = Spec::new("eu-1", "eu", 0x11, free_udp_addr());
    let us = Spec::new("us-1", "us", 0x22, free_udp_addr());
    let ap = Spec::new("ap-1", "ap", 0x33, free_udp_addr());
    let eu_handle = eu.spawn_udp(&[]).await;
    let us_handle = us.spawn_udp(&[&eu]).await;
    let ap_handle = ap.spawn_udp(&[&eu]).await;
    wait_for_full_mesh(&[(&eu, &eu_handle), (&us, &us_handle), (&ap, &ap_handle)]).await;

    let start = Instant::now();
    ap_handle.shutdown().await.expect("clean shutdown");
    eprintln!("ap's shutdown took {:?}", start.elapsed());
    wait_until("eu marks ap down", &eu_handle, |m| ap.is_down_in(m)).await;
    wait_until("us marks ap down", &us_handle, |m| ap.is_down_in(m)).await;
    assert!(us.is_alive_in(&eu_handle.members()));
    assert!(eu.is_alive_in(&us_handle.members()));

    shutdown_all([eu_handle, us_handle]).await;
}

/// No leave here: only the failure detector can tell, and it must also
/// notice the return.
#[tokio::test]
async fn an_isolated_node_is_marked_down_then_up_again() {
    let transport = ChannelTransport::default();
    let a = Spec::new("a", "eu", 0xa, "127.0.0.1:10001".parse().unwrap());
    let b = Spec::new("b", "us", 0xb, "127.0.0.1:10002".parse().unwrap());
    let c = Spec::new("c", "ap", 0xc, "127.0.0.1:10003".parse().unwrap());
    let a_handle = a.spawn_in(&transport, &[]).await;
    let b_handle = b.spawn_in(&transport, &[&a]).await;
    let c_handle = c.spawn_in(&transport, &[&a]).await;
    wait_for_full_mesh(&[(&a, &a_handle), (&b, &b_handle), (&c, &c_handle)]).await;

    transport.remove_link(c.gossip, a.gossip).await;
    transport.remove_link(c.gossip, b.gossip).await;
    wait_until("a marks the isolated c down", &a_handle, |m| {
        c.is_down_in(m)
    })
    .await;
    wait_until("b marks the isolated c down", &b_handle, |m| {
        c.is_down_in(m)
    })
    .await;
    wait_until("c marks a and b down", &c_handle, |m| {
        a.is_down_in(m) && b.is_down_in(m)
    })
    .await;
    assert!(b.is_alive_in(&a_handle.members()));

    transport.add_link(c.gossip, a.gossip).await;
    transport.add_link(c.gossip, b.gossip).await;
    wait_for_full_mesh(&[(&a, &a_handle), (&b, &b_handle), (&c, &c_handle)]).await;

    shutdown_all([a_handle, b_handle, c_handle]).await;
}

#[tokio::test]
async fn a_node_restarted_with_a_wiped_disk_replaces_its_old_incarnation() {
    let transport = ChannelTransport::default();
    let a = Spec::new("a", "eu", 0xa, "127.0.0.1:10001".parse().unwrap());
    let b = Spec::new("b", "us", 0xb, "127.0.0.1:10002".parse().unwrap());
    let a_handle = a.spawn_in(&transport, &[]).await;
    let b_handle = b.spawn_in(&transport, &[&a]).await;
    wait_for_full_mesh(&[(&a, &a_handle), (&b, &b_handle)]).await;

    b_handle.shutdown().await.expect("clean shutdown");
    wait_until("a marks b down", &a_handle, |m| b.is_down_in(m)).await;
    // The generation id is the start time in ms: make sure it moves on.
    sleep(Duration::from_millis(5)).await;
    let wiped_b = Spec {
        replica: ReplicaId(0xb2),
        ..b.clone()
    };
    let wiped_b_handle = wiped_b.spawn_in(&transport, &[&a]).await;
    wait_until("a lists only b's new incarnation", &a_handle, |members| {
        members.len() == 1 && wiped_b.is_alive_in(members)
    })
    .await;
    wait_until("the new b sees a", &wiped_b_handle, |m| {
        m.len() == 1 && a.is_alive_in(m)
    })
    .await;

    shutdown_all([a_handle, wiped_b_handle]).await;
}
