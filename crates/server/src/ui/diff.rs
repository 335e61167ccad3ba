//! A line diff (longest common subsequence) between two texts, for comparing workflow versions.
//! Pure; quadratic in the number of lines, which definitions keep small.

/// One line of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// The lines of `old` and `new` in order, each kept, removed or added.
pub(crate) fn diff<'a>(old: &'a str, new: &'a str) -> Vec<Line<'a>> {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    // common[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut lines = Vec::with_capacity(a.len().max(b.len()));
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push(Line::Same(a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || common[i + 1][j] >= common[i][j + 1]) {
            lines.push(Line::Removed(a[i]));
            i += 1;
        } else {
            lines.push(Line::Added(b[j]));
            j += 1;
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use Line::*;

    #[track_caller]
    fn check(old: &str, new: &str, expected: &[Line<'_>]) {
        assert_eq!(diff(old, new), expected);
    }

    #[test]
    fn diffs_keep_common_lines_and_mark_the_rest() {
        check("a\nb\nc", "a\nb\nc", &[Same("a"), Same("b"), Same("c")]);
        check("a\nb\nc", "a\nc", &[Same("a"), Removed("b"), Same("c")]);
        check("a\nc", "a\nb\nc", &[Same("a"), Added("b"), Same("c")]);
        check("a\nb", "a\nx", &[Same("a"), Removed("b"), Added("x")]);
        check("", "x", &[Added("x")]);
        check("x", "", &[Removed("x")]);
    }
}
