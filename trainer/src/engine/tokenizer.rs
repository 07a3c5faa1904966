//! Tokenizer and chat template, as Hugging Face does them: `tokenizers` over `tokenizer.json`,
//! and the `chat_template` of `tokenizer_config.json` rendered with a Jinja engine (minijinja,
//! with Python string methods, `trim_blocks` and `lstrip_blocks` as transformers sets them). A
//! folder without a template gets ChatML.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self { role: role.to_string(), content: content.into() }
    }
}

/// ChatML, the fallback template (Qwen, SmolLM2).
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + \
'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Ids that end generation: the config's EOS token and `<|im_end|>` / `<|endoftext|>` when
    /// the vocabulary has them.
    pub eos_ids: Vec<u32>,
    pub pad_id: Option<u32>,
}

/// A special-token field of tokenizer_config.json: a string or `{"content": ...}`.
fn token_field(cfg: &Value, key: &str) -> Option<String> {
    match cfg.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Load `tokenizer.json` and, when present, `tokenizer_config.json` from a folder.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| TokenizerError::Read { path: path.display().to_string(), message: e.to_string() })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| TokenizerError::Read { path: cfg_path.display().to_string(), message: e.to_string() })?,
            Err(_) => Value::Null,
        };
        let template = match cfg.get("chat_template") {
            Some(Value::String(t)) => t.clone(),
            // A list of named templates: take "default".
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .unwrap_or(CHATML)
                .to_string(),
            _ => CHATML.to_string(),
        };
        Ok(Self::assemble(
            inner,
            template,
            token_field(&cfg, "bos_token"),
            token_field(&cfg, "eos_token"),
            token_field(&cfg, "pad_token").as_deref(),
        ))
    }

    /// Wrap an in-memory tokenizer with ChatML and the given special tokens.
    pub fn from_parts(inner: tokenizers::Tokenizer, eos_token: Option<String>, pad_token: Option<&str>) -> Tokenizer {
        Self::assemble(inner, CHATML.to_string(), None, eos_token, pad_token)
    }

    fn assemble(
        inner: tokenizers::Tokenizer,
        template: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
        pad_token: Option<&str>,
    ) -> Tokenizer {
        let mut eos_ids: Vec<u32> = eos_token.iter().filter_map(|t| inner.token_to_id(t)).collect();
        for t in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = inner.token_to_id(t).filter(|id| !eos_ids.contains(id)) {
                eos_ids.push(id);
            }
        }
        let pad_id = pad_token.and_then(|t| inner.token_to_id(t));
        Tokenizer { inner, template, bos_token, eos_token, eos_ids, pad_id }
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encode without adding special tokens (chat templates carry their own).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, false).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| TokenizerError::Tokenizer(e.to_string()))
    }

    /// Render a conversation with the model's chat template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render(messages, add_generation_prompt, None)
    }

    /// As [`Tokenizer::apply_chat_template`], with template variables such as `enable_thinking`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, Value>>,
    ) -> Result<String, TokenizerError> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template("chat", &self.template).map_err(|e| TokenizerError::Template(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).map_err(|e| TokenizerError::Template(e.to_string()))?,
        );
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().unwrap_or_default().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().unwrap_or_default().into());
        if let Some(extra) = extra {
            ctx.extend(extra.clone());
        }
        let tmpl = env.get_template("chat").map_err(|e| TokenizerError::Template(e.to_string()))?;
        tmpl.render(minijinja::Value::from_serialize(&ctx)).map_err(|e| TokenizerError::Template(e.to_string()))
    }
}
