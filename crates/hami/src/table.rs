//! Plain-text tables with columns sized to their content, as kubectl prints them.

pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                line.push_str(cell);
                if i + 1 < columns {
                    line.extend(std::iter::repeat_n(' ', width - cell.chars().count() + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["A", "LONG HEADER", "C"]);
        t.row(vec!["wide cell".into(), "x".into(), "y".into()]);
        t.row(vec!["z".into()]);
        assert_eq!(
            t.render(),
            "A          LONG HEADER  C\nwide cell  x            y\nz\n"
        );
    }
}
