//! The workflows wing: what makes, fine-tunes and evaluates policies other than RL training.
//! Supervised fine-tuning (`sft`), the scripted agent of the synthetic world (`scripted`), warm
//! starts from nothing (`warmstart`), evaluation of a native policy (`eval`) and of one served
//! behind an OpenAI-compatible API (`openai`).

pub mod eval;
pub mod openai;
pub mod scripted;
pub mod sft;
pub mod warmstart;
