//! The one schema of a bench row: what `trainer bench --json` and `env-server bench --json`
//! print, one JSON object per line, and what `cargo xtask bench` reads back into its table.

use serde::{Deserialize, Deserializer, Serialize};

/// One figure: what, its value (formatted), its unit, and a baseline or note.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchRow {
    pub figure: String,
    /// Formatted as the table shows it; a bare JSON number is read as its text.
    #[serde(deserialize_with = "text_or_number")]
    pub value: String,
    #[serde(default)]
    pub unit: String,
    #[serde(default)]
    pub note: String,
}

impl BenchRow {
    pub fn new(figure: impl Into<String>, value: impl Into<String>, unit: &str, note: impl Into<String>) -> Self {
        Self { figure: figure.into(), value: value.into(), unit: unit.into(), note: note.into() }
    }

    /// The row as one JSON line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A row from one JSON line; `None` for a line that is not one (a log line, say).
    pub fn from_json_line(line: &str) -> Option<Self> {
        serde_json::from_str(line).ok()
    }
}

fn text_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_numbers_read_as_text() {
        let row = BenchRow::new("generation, batch 64", "123.4", "tokens/s", "median of 3");
        assert_eq!(BenchRow::from_json_line(&row.to_json_line()), Some(row));
        let hf = BenchRow::from_json_line(r#"{"figure": "prefill", "value": 1977.4, "unit": "tokens/s", "note": ""}"#);
        assert_eq!(hf.map(|r| r.value), Some("1977.4".to_string()));
        assert_eq!(BenchRow::from_json_line("trainer bench: running, 30 s"), None);
    }
}
