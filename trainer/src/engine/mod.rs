//! The engine wing: a Hugging Face causal LM in libtorch and what runs it. The model (`model/`),
//! generation with a KV cache (`generate/`), per-token log-probabilities (`logprobs`), the
//! optimiser (`optim`), tokenizer and chat template (`tokenizer`), devices and precisions
//! (`device`), GGUF reading and import (`gguf`, `import`), parity with transformers (`parity`),
//! the memory plan (`plan`) and a small policy from scratch (`scratch`). Nothing here knows of
//! env-servers, rollouts or the RL algorithm.

pub mod device;
pub mod generate;
pub mod gguf;
pub mod import;
pub mod logprobs;
pub mod model;
pub mod optim;
pub mod parity;
pub mod plan;
pub mod scratch;
pub mod tokenizer;
