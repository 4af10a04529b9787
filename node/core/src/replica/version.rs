//! Protocol versions, the cluster version and the [`Feature`] list: what
//! lets a cluster be upgraded one node (one region) at a time and rolled
//! back before the upgrade is finalized. Pure: membership comes in as
//! [`Member`]s.
//!
//! - Each build speaks a window of protocol versions, [`OLDEST`] to
//!   [`NEWEST`]. A version names on-disk record formats and wire formats
//!   together. A release talks to the release before it and after it, no
//!   further: this release's window is `12..=12`. Versions 1 to 11 (every
//!   format and protocol change up to scoped folds, listed in
//!   `CHANGELOG.md`) are behind it: a data directory or a peer older than
//!   the window is refused with a message naming [`UPGRADE_THROUGH`], the
//!   release to upgrade through first.
//! - Every change of an encoding or a protocol is one [`Feature`], written
//!   only when [`ClusterVersion::supports`] it (and, where a feature is
//!   asked of one peer, sent to that peer only when its
//!   [`ProtocolWindow::supports`] it). A node that announces nothing (a
//!   build before versions) counts as `1..=1`.
//! - The **cluster version** is the newest version this node may *write*. It
//!   starts at [`OLDEST`] in a new data directory, is persisted in the data
//!   directory before anything of it is written, and only rises: to the
//!   newest version that this node and every member it knows (every region,
//!   live or not) speak ([`next_cluster_version`]). Once it has risen, the
//!   node's window starts there, so a build that cannot read what is now
//!   written is refused.
//! - A **new cluster** starts at the newest version by itself
//!   ([`new_cluster_version`]): when every data directory in it (this
//!   node's and every member's it talks with) was created by a build that
//!   speaks that version (each node announces it as `born_at`), no member
//!   ever ran an older build, so there is no rollback to keep open and no
//!   `tally admin finalize` to wait for. A directory created before builds
//!   recorded it counts as born at 0, and holds its cluster to the old rules.
//!
//! **Adding a feature**: raise [`NEWEST`] by one, add a [`Feature`] variant
//! whose [`Feature::introduced_in`] is the new `NEWEST`, and gate its writes
//! on `cluster.supports(Feature::…)` (its reads need no gate: a build reads
//! every format of its window). **Moving the window** (a release that drops
//! the release before it): raise [`OLDEST`] to the previous release's
//! `NEWEST`, set [`UPGRADE_THROUGH`] to that release, delete every variant
//! introduced at or below the new `OLDEST` together with its gates (the
//! feature is on in every cluster this build opens), and delete the
//! writers of formats older than it. Readers of old *record* formats stay
//! as long as such records can remain in a data directory (records are
//! rewritten only when they change; see `store/encoding.rs`).
//!
//! Invariant: two nodes exchange state only when their windows overlap
//! ([`ProtocolWindow::talks_with`]), and a node never writes a format newer
//! than a member it knows can read, so a half-upgraded cluster keeps working
//! and any node can be rolled back until the cluster version moves.

use super::Member;

/// The oldest protocol version this build speaks (and the cluster version of
/// a new data directory). Anything older is refused.
pub const OLDEST: u32 = 12;
/// The newest protocol version this build speaks and can write.
pub const NEWEST: u32 = 12;
/// The release a data directory or a node older than [`OLDEST`] must be
/// upgraded through first: the last release whose window reaches back to
/// the versions behind ours, and that finalizes at [`OLDEST`].
pub const UPGRADE_THROUGH: &str = "Tally 0.1 (protocol 12)";
/// The window of a build before protocol versions existed: it announced
/// nothing, which counts as version 1.
const BEFORE_VERSIONS: u32 = 1;

/// A change of an encoding or a protocol since [`OLDEST`]: the one place
/// new features go (see "Adding a feature" above). Every feature up to
/// [`OLDEST`] is on in every cluster this build opens, so it has no
/// variant and no gate.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Feature {
    /// A feature of the version after [`NEWEST`], for the mechanism's tests.
    #[cfg(test)]
    NextVersion,
}

impl Feature {
    /// The protocol version that brought the feature: a cluster writes it
    /// from this cluster version on, and a peer speaks it when its window
    /// reaches this version.
    pub const fn introduced_in(self) -> u32 {
        match self {
            #[cfg(test)]
            Feature::NextVersion => NEWEST + 1,
        }
    }
}

/// A node's cluster version (the persisted record format): what it may
/// write.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ClusterVersion(pub u32);

impl ClusterVersion {
    /// Whether a cluster at this version writes `feature`'s formats.
    pub fn supports(self, feature: Feature) -> bool {
        self.0 >= feature.introduced_in()
    }
}

/// The protocol versions a node speaks, oldest to newest (inclusive).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ProtocolWindow {
    /// The oldest version it still reads and answers.
    pub oldest: u32,
    /// The newest version it speaks.
    pub newest: u32,
}

impl Default for ProtocolWindow {
    /// This build's window, [`OLDEST`] to [`NEWEST`] (a node that announces
    /// no window is [`ProtocolWindow::announced`]`(0, 0)`, version 1).
    fn default() -> Self {
        ProtocolWindow {
            oldest: OLDEST,
            newest: NEWEST,
        }
    }
}

impl ProtocolWindow {
    /// This build's window at cluster version `cluster_version`, when it
    /// speaks versions up to `newest` (this build's [`NEWEST`]; other values
    /// in tests of the mechanism).
    pub fn at(cluster_version: u32, newest: u32) -> Self {
        ProtocolWindow {
            oldest: cluster_version.min(newest),
            newest,
        }
    }

    /// A window as announced on the wire or in gossip, where 0 (a field a
    /// build before versions does not send) means version 1.
    pub fn announced(oldest: u32, newest: u32) -> Self {
        let newest = newest.max(BEFORE_VERSIONS);
        ProtocolWindow {
            oldest: oldest.clamp(BEFORE_VERSIONS, newest),
            newest,
        }
    }

    /// Whether a node with this window and one with `other` share a version.
    pub fn talks_with(&self, other: &ProtocolWindow) -> bool {
        self.oldest <= other.newest && other.oldest <= self.newest
    }

    /// Whether a node with this window speaks `feature` (may be sent it).
    pub fn supports(&self, feature: Feature) -> bool {
        self.newest >= feature.introduced_in()
    }

    /// Whether a node with this window runs a release behind this build's
    /// window: it must be upgraded through [`UPGRADE_THROUGH`] first.
    pub fn is_behind_this_release(&self) -> bool {
        self.newest < OLDEST
    }

    /// What to do about a peer with window `theirs` that this node (with
    /// this window) refuses: which of the two to upgrade, and through which
    /// release.
    pub fn refusal_advice(&self, theirs: &ProtocolWindow) -> String {
        if theirs.is_behind_this_release() {
            format!(
                "it runs a release older than this one can talk to: upgrade it to \
                 {UPGRADE_THROUGH} first (and finalize there), then to this release"
            )
        } else if theirs.oldest > self.newest {
            "it runs a newer release whose upgrade was finalized: upgrade this node".into()
        } else {
            "upgrade the older of the two (see \"Upgrading\" in the operations guide)".into()
        }
    }

    /// The reason a refusal of a peer with window `theirs` is counted under
    /// (`tally_refused_messages_total`; both are in
    /// `metrics::REFUSAL_REASONS`).
    pub fn refusal_reason(theirs: &ProtocolWindow) -> &'static str {
        if theirs.is_behind_this_release() {
            "protocol_too_old"
        } else {
            "incompatible_protocol"
        }
    }
}

impl std::fmt::Display for ProtocolWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.oldest, self.newest)
    }
}

/// The cluster version to move to from `current`: the newest version that
/// this node (speaking up to `own_newest`) and every one of `members` speak,
/// never below `current`. Members this node refuses (no shared version) do
/// not hold it back: they cannot take part either way.
pub fn next_cluster_version(current: u32, own_newest: u32, members: &[Member]) -> u32 {
    let own = ProtocolWindow::at(current, own_newest);
    members
        .iter()
        .filter(|member| own.talks_with(&member.protocol))
        .map(|member| member.protocol.newest)
        .fold(own_newest, u32::min)
        .max(current)
}

/// The cluster version a node in manual mode moves to: the version a member
/// was finalized at (its window starts there), as far as this node and every
/// member speak it ([`next_cluster_version`]); never below `current`. With no
/// finalized member it stays at `current`.
pub fn followed_cluster_version(current: u32, own_newest: u32, members: &[Member]) -> u32 {
    let own = ProtocolWindow::at(current, own_newest);
    let finalized = members
        .iter()
        .filter(|member| own.talks_with(&member.protocol))
        .map(|member| member.protocol.oldest)
        .fold(current, u32::max);
    next_cluster_version(current, own_newest, members)
        .min(finalized)
        .max(current)
}

/// The cluster version a new cluster moves to without `tally admin finalize`:
/// the newest that this node and every member speak ([`next_cluster_version`]),
/// when this node's data directory (`own_born_at`) and every member's that it
/// talks with were created by a build that speaks `own_newest`; otherwise
/// `current`. Such a cluster never ran an older build, so moving closes no
/// rollback. One directory of an older build (or of a build before `born_at`
/// was recorded, 0) keeps the whole cluster waiting for finalize.
pub fn new_cluster_version(
    current: u32,
    own_newest: u32,
    own_born_at: u32,
    members: &[Member],
) -> u32 {
    let own = ProtocolWindow::at(current, own_newest);
    let all_new = own_born_at >= own_newest
        && members
            .iter()
            .filter(|member| own.talks_with(&member.protocol))
            .all(|member| member.born_at >= own_newest);
    if all_new {
        next_cluster_version(current, own_newest, members)
    } else {
        current
    }
}

/// What may move a node's cluster version now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Moves {
    /// Before the settle time: only following a member that was finalized
    /// already. That closes no rollback that was still open (the member's
    /// own move did), and a build that cannot read the version is refused
    /// by that member anyway, so it needs no listening first; a node that
    /// joins a finalized cluster then writes its formats from its first
    /// commits (a joiner copies partitions in within seconds, and records
    /// learned in an older format lose their partitions).
    FollowOnly,
    /// Manual mode after the settle time: following, or a new cluster
    /// ([`new_cluster_version`]; `born_at` is this node's directory's).
    Manual {
        /// The version of the build that created this node's directory.
        born_at: u32,
    },
    /// Automatic mode after the settle time: the newest every member speaks.
    Auto,
}

/// The cluster version the keeper (`upgrade.rs`) moves to from `current`.
pub fn cluster_version_target(
    mode: Moves,
    current: u32,
    own_newest: u32,
    members: &[Member],
) -> u32 {
    let followed = followed_cluster_version(current, own_newest, members);
    match mode {
        Moves::FollowOnly => followed,
        Moves::Manual { born_at } => {
            followed.max(new_cluster_version(current, own_newest, born_at, members))
        }
        Moves::Auto => next_cluster_version(current, own_newest, members),
    }
}

/// The cluster version `tally admin finalize` moves to: the newest this node
/// speaks, or the members (that this node talks with) that do not speak it
/// yet. Refused members do not count, as in [`next_cluster_version`].
pub fn finalize_target(
    current: u32,
    own_newest: u32,
    members: &[Member],
) -> Result<u32, Vec<&Member>> {
    let own = ProtocolWindow::at(current, own_newest);
    let behind: Vec<&Member> = members
        .iter()
        .filter(|member| own.talks_with(&member.protocol) && member.protocol.newest < own_newest)
        .collect();
    if behind.is_empty() {
        Ok(own_newest.max(current))
    } else {
        Err(behind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(oldest: u32, newest: u32) -> Member {
        Member {
            protocol: ProtocolWindow { oldest, newest },
            ..Member::default()
        }
    }

    fn born(oldest: u32, newest: u32, born_at: u32) -> Member {
        Member {
            born_at,
            ..member(oldest, newest)
        }
    }

    #[test]
    fn a_feature_is_written_from_its_version_and_sent_to_peers_that_speak_it() {
        let feature = Feature::NextVersion;
        assert_eq!(feature.introduced_in(), NEWEST + 1);
        assert!(!ClusterVersion(NEWEST).supports(feature));
        assert!(ClusterVersion(NEWEST + 1).supports(feature));
        let this_release = ProtocolWindow::at(OLDEST, NEWEST);
        let next_release = ProtocolWindow::at(NEWEST, NEWEST + 1);
        assert!(!this_release.supports(feature));
        assert!(next_release.supports(feature));
        // The next release talks with this one until it finalizes.
        assert!(next_release.talks_with(&this_release));
        assert!(!ProtocolWindow::at(NEWEST + 1, NEWEST + 1).talks_with(&this_release));
    }

    #[test]
    fn a_peer_behind_the_window_is_told_the_release_to_upgrade_through() {
        assert!(UPGRADE_THROUGH.contains(&format!("protocol {OLDEST}")));
        let ours = ProtocolWindow::at(OLDEST, NEWEST);
        let behind = ProtocolWindow {
            oldest: 1,
            newest: OLDEST - 1,
        };
        for old in [behind, ProtocolWindow::announced(0, 0)] {
            assert!(!ours.talks_with(&old), "{old}");
            assert!(ours.refusal_advice(&old).contains(UPGRADE_THROUGH), "{old}");
            assert_eq!(ProtocolWindow::refusal_reason(&old), "protocol_too_old");
        }
        let newer = ProtocolWindow::at(NEWEST + 1, NEWEST + 1);
        assert!(ours.refusal_advice(&newer).contains("upgrade this node"));
        assert_eq!(
            ProtocolWindow::refusal_reason(&newer),
            "incompatible_protocol"
        );
    }

    #[test]
    fn a_cluster_whose_every_directory_was_born_at_the_newest_version_starts_there() {
        let members = [born(1, 3, 3), born(1, 3, 3)];
        assert_eq!(new_cluster_version(1, 3, 3, &members), 3);
        assert_eq!(new_cluster_version(1, 3, 3, &[]), 3, "a single node");
        // This node's own directory is older: it waits for finalize.
        assert_eq!(new_cluster_version(1, 3, 2, &members), 1);
        assert_eq!(new_cluster_version(1, 3, 0, &[]), 1);
        // One member's directory was created by an older build (or a build
        // before born_at was announced): everyone waits for finalize.
        assert_eq!(
            new_cluster_version(1, 3, 3, &[born(1, 3, 3), born(1, 3, 2)]),
            1
        );
        assert_eq!(
            new_cluster_version(1, 3, 3, &[born(1, 3, 3), born(1, 3, 0)]),
            1
        );
        // A member running an older build holds it back even if born new.
        assert_eq!(new_cluster_version(1, 3, 3, &[born(1, 2, 3)]), 2);
        // A member this node refuses (no shared version) does not count.
        assert_eq!(new_cluster_version(3, 3, 3, &[born(1, 1, 0)]), 3);
        // Never back.
        assert_eq!(new_cluster_version(3, 3, 0, &members), 3);
        // A newer build in an all-new cluster of this version (born at 3)
        // does not move past what it was born at without finalize.
        assert_eq!(new_cluster_version(3, 4, 3, &[born(3, 4, 3)]), 3);
    }

    #[test]
    fn windows_talk_when_they_share_a_version() {
        let before_versions = ProtocolWindow::announced(0, 0);
        let this = ProtocolWindow::at(1, 2);
        assert!(this.talks_with(&before_versions));
        assert!(this.talks_with(&ProtocolWindow::at(2, 3)));
        assert!(!this.talks_with(&ProtocolWindow::at(3, 4)));
        let finalized = ProtocolWindow::at(2, 2);
        assert!(!finalized.talks_with(&before_versions));
        assert_eq!(
            ProtocolWindow::default(),
            ProtocolWindow::at(OLDEST, NEWEST),
            "this build's own"
        );
    }

    #[test]
    fn a_window_that_announces_nothing_is_version_one() {
        assert_eq!(
            ProtocolWindow::announced(0, 0),
            ProtocolWindow {
                oldest: 1,
                newest: 1
            }
        );
        assert_eq!(
            ProtocolWindow::announced(0, 2),
            ProtocolWindow {
                oldest: 1,
                newest: 2
            }
        );
    }

    #[test]
    fn the_cluster_version_waits_for_the_oldest_member() {
        let members = [member(1, 2), member(1, 1)];
        assert_eq!(next_cluster_version(1, 2, &members), 1);
        assert_eq!(next_cluster_version(1, 2, &members[..1]), 2);
        assert_eq!(next_cluster_version(1, 2, &[]), 2);
        // A node posing as version 1 never moves past it.
        assert_eq!(next_cluster_version(1, 1, &members[..1]), 1);
    }

    #[test]
    fn the_cluster_version_never_goes_back_and_ignores_refused_members() {
        // Finalized at 2: a version-1 node appearing now is refused, not obeyed.
        assert_eq!(next_cluster_version(2, 2, &[member(1, 1)]), 2);
        // A node that speaks only newer versions does not hold us back.
        assert_eq!(next_cluster_version(1, 2, &[member(3, 4)]), 2);
    }

    #[test]
    fn manual_mode_follows_only_a_finalized_member_that_everyone_can_follow() {
        // Everyone speaks 2, nobody finalized: stay at 1.
        assert_eq!(followed_cluster_version(1, 2, &[member(1, 2)]), 1);
        // A member finalized at 2: follow it.
        assert_eq!(followed_cluster_version(1, 2, &[member(2, 2)]), 2);
        // ... unless another member cannot read version 2.
        assert_eq!(
            followed_cluster_version(1, 2, &[member(2, 2), member(1, 1)]),
            1
        );
        // Never down.
        assert_eq!(followed_cluster_version(2, 2, &[member(1, 2)]), 2);
    }

    #[test]
    fn before_the_settle_time_a_node_only_follows_a_finalized_member() {
        let all_new = [born(1, 3, 3), born(1, 3, 3)];
        // Nothing finalized: a new cluster and auto mode wait for the settle time.
        assert_eq!(cluster_version_target(Moves::FollowOnly, 1, 3, &all_new), 1);
        let manual = Moves::Manual { born_at: 3 };
        assert_eq!(cluster_version_target(manual, 1, 3, &all_new), 3);
        assert_eq!(cluster_version_target(Moves::Auto, 1, 3, &all_new), 3);
        // A member finalized at 3 (a joiner's first view of its cluster):
        // followed at once.
        let finalized = [born(3, 3, 3), born(1, 3, 0)];
        assert_eq!(
            cluster_version_target(Moves::FollowOnly, 1, 3, &finalized),
            3
        );
        // ... but not past what every member it knows speaks.
        let behind = [born(3, 3, 3), born(1, 2, 3)];
        assert_eq!(cluster_version_target(Moves::FollowOnly, 1, 3, &behind), 2);
        // Knowing no member yet, it stays.
        assert_eq!(cluster_version_target(Moves::FollowOnly, 1, 3, &[]), 1);
    }

    #[test]
    fn finalize_names_the_members_that_do_not_speak_the_newest_version() {
        assert_eq!(finalize_target(1, 2, &[member(1, 2)]), Ok(2));
        assert_eq!(finalize_target(2, 2, &[member(2, 2)]), Ok(2));
        let old = member(1, 1);
        let members = [member(1, 2), old.clone()];
        assert_eq!(finalize_target(1, 2, &members), Err(vec![&old]));
        // A member refused anyway (no shared version) does not hold it back.
        assert_eq!(finalize_target(2, 2, &[member(1, 1)]), Ok(2));
    }
}
