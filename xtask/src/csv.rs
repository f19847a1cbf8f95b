//! The few CSV files of the schema folder: no quoting beyond a last quoted
//! column, so a small reader suffices.

/// Splits one CSV line into fields, honouring double quotes (`""` inside a
/// quoted field is a quote).
pub fn split_line(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Parses a whole CSV text into rows, skipping empty lines.
pub fn parse(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .map(split_line)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_fields() {
        assert_eq!(
            super::split_line(r#"Good,0x00000000,"The operation ""succeeded"", really.""#),
            [
                "Good",
                "0x00000000",
                r#"The operation "succeeded", really."#
            ]
        );
        assert_eq!(super::split_line("a,,b"), ["a", "", "b"]);
    }
}
