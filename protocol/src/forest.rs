//! Forests: the trees of one prompt, grown by rows that may live in different processes (verl's
//! agent-loop workers). Every row sends [`JoinForest`] with the prompt's key and gets a
//! [`ForestRole`]: play a tree's initial chain, or continue from a node the server picked and
//! forked. The server holds the trees, so no worker needs another's memory. Also the opaque
//! per-step client bytes ([`StepData`]) that forks inherit, so a worker can rebuild the exact
//! token prefix of a node another worker generated.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::EpisodeId;
use crate::messages::{EpisodeOptions, TaskSpec};

/// Opaque client bytes kept with a step (a MessagePack `bin`). Grove's agents store the token ids
/// they generated in that turn and their log-probs; the server never reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepData(pub Vec<u8>);

impl Serialize for StepData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for StepData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = StepData;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes (a MessagePack bin)")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<StepData, E> {
                Ok(StepData(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<StepData, E> {
                Ok(StepData(v))
            }
            // A client whose MessagePack library writes bytes as an array of integers.
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<StepData, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(StepData(out))
            }
        }
        d.deserialize_bytes(Bytes)
    }
}

/// The paper's tree shape: `m` trees per prompt, `n` nodes picked per tree per round, `l`
/// rounds, `k` leaves per tree. In a forest every chain is a row, so `k = 1 + n l`; chain GRPO
/// with `g` rows is `(g, 0, 0, 1)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForestShape {
    pub m: u32,
    pub n: u32,
    pub l: u32,
    pub k: u32,
}

impl ForestShape {
    /// Rows (chains, leaves) of the whole forest: `m k`.
    pub fn rows(&self) -> u64 {
        u64::from(self.m) * u64::from(self.k)
    }
}

/// Join the forest named `key` as its next row. Every row of one prompt sends the same key,
/// shape, seed and task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinForest {
    pub key: String,
    pub shape: ForestShape,
    /// Seeds the server's node picks.
    pub seed: u64,
    pub task: TaskSpec,
    pub options: EpisodeOptions,
}

/// A node of a tree: an episode after `step` completed steps (0: the prompt alone, the root).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForestNode {
    pub episode: EpisodeId,
    pub step: u32,
}

/// One step of the prefix a row continues from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefixStep {
    pub action: String,
    pub observation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<StepData>,
}

/// What one row of a forest plays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForestRole {
    pub key: String,
    /// Join order, `0 .. m k`.
    pub row: u32,
    /// `0 .. m`.
    pub tree: u32,
    /// 0: the tree's initial chain; `r >= 1`: a continuation of expansion round `r`.
    pub round: u32,
    /// The episode this row plays, created or forked for it by the forest.
    pub episode: EpisodeId,
    /// The rendered prompt.
    pub prompt: String,
    pub max_turns: u32,
    /// The node this row continues from (absent for round 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<ForestNode>,
    /// Steps `1..=from.step` of the node's chain, in order: what the row continues after.
    pub prefix: Vec<PrefixStep>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_data_is_a_msgpack_bin_and_also_reads_an_integer_array() {
        let bytes = rmp_serde::to_vec_named(&StepData(vec![1, 2, 255])).unwrap();
        assert_eq!(bytes, [0xc4, 3, 1, 2, 255], "bin 8");
        let back: StepData = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back.0, [1, 2, 255]);
        let as_array = rmp_serde::to_vec(&vec![1u8, 2, 255]).unwrap();
        assert_eq!(rmp_serde::from_slice::<StepData>(&as_array).unwrap().0, [1, 2, 255]);
        assert!(rmp_serde::from_slice::<StepData>(&rmp_serde::to_vec(&vec![300u16]).unwrap()).is_err());
    }

    #[test]
    fn a_forest_has_m_k_rows() {
        assert_eq!(ForestShape { m: 2, n: 2, l: 1, k: 3 }.rows(), 6);
        assert_eq!(ForestShape { m: u32::MAX, n: 0, l: 0, k: u32::MAX }.rows(), u64::from(u32::MAX).pow(2));
    }
}
