//! Schema-directed JSON -> Avro, no DOM: the payload is scanned once, each value written as it is read.
//!
//! True with the reference's bytes, or false wherever the reference might do anything else (then the
//! caller hands the payload to the Python encoder). Record fields may come in any
//! order (jsonb writes keys by length, then bytes): each field is written where it is read and the record's
//! bytes are put in schema order afterwards, when they are not in it already.

use crate::{varint, Node, FLT_MAX};

pub struct Direct<'a> {
    s: &'a [u8],
    i: usize,
    tmp: Vec<u8>,
    text: Vec<u8>,
}

#[derive(PartialEq)]
enum Num {
    Int(i64),
    UInt(u64), // above i64::MAX, within u64
    Float(f64),
}

impl<'a> Direct<'a> {
    pub fn new(s: &'a [u8]) -> Option<Self> {
        std::str::from_utf8(s).ok()?; // orjson refuses what is not UTF-8
        Some(Direct {
            s,
            i: 0,
            tmp: Vec::new(),
            text: Vec::new(),
        })
    }

    pub fn encode_document(&mut self, node: &Node, out: &mut Vec<u8>) -> bool {
        self.ws();
        if !self.value(node, out) {
            return false;
        }
        self.ws();
        self.i == self.s.len()
    }

    #[inline]
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> u8 {
        if self.i < self.s.len() {
            self.s[self.i]
        } else {
            0
        }
    }

    fn lit(&mut self, word: &[u8]) -> bool {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    /// A string at '"': its bytes, unescaped, in self.text (or borrowed when it has no escapes).
    fn string(&mut self) -> Option<(usize, usize, bool)> {
        self.i += 1;
        let start = self.i;
        loop {
            let c = *self.s.get(self.i)?;
            match c {
                b'"' => {
                    self.i += 1;
                    return Some((start, self.i - 1, false));
                }
                b'\\' => break,
                0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
        self.text.clear();
        self.text.extend_from_slice(&self.s[start..self.i]);
        loop {
            let c = *self.s.get(self.i)?;
            match c {
                b'"' => {
                    self.i += 1;
                    return Some((0, 0, true));
                }
                b'\\' => {
                    let e = *self.s.get(self.i + 1)?;
                    self.i += 2;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            if (0xD800..0xDC00).contains(&hi) {
                                if self.s.get(self.i) != Some(&b'\\')
                                    || self.s.get(self.i + 1) != Some(&b'u')
                                {
                                    return None; // a lone surrogate: the reference decides
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return None;
                                }
                                char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                            } else {
                                char::from_u32(hi)?
                            }
                        }
                        _ => return None,
                    };
                    let mut b = [0u8; 4];
                    self.text
                        .extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                }
                0..=0x1f => return None,
                _ => {
                    self.text.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// After an array item or a record member: Some(false) past a ',', Some(true) past `close`, None for
    /// anything else.
    fn next_item(&mut self, close: u8) -> Option<bool> {
        self.ws();
        let c = self.peek();
        if c == b',' || c == close {
            self.i += 1;
            Some(c == close)
        } else {
            None
        }
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.i..self.i + 4)?;
        self.i += 4;
        u32::from_str_radix(std::str::from_utf8(h).ok()?, 16)
            .ok()
            .filter(|_| h.iter().all(u8::is_ascii_hexdigit))
    }

    fn str_bytes(&self, span: (usize, usize, bool)) -> &[u8] {
        if span.2 {
            &self.text
        } else {
            &self.s[span.0..span.1]
        }
    }

    /// Past a run of ASCII digits: how many.
    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.peek().is_ascii_digit() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Option<Num> {
        let start = self.i;
        if self.peek() == b'-' {
            self.i += 1;
        }
        let first = self.i;
        let nd = self.digits();
        if nd == 0 || (nd > 1 && self.s[first] == b'0') {
            return None;
        }
        let mut float = false;
        if self.peek() == b'.' {
            float = true;
            self.i += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if matches!(self.peek(), b'e' | b'E') {
            float = true;
            self.i += 1;
            if matches!(self.peek(), b'+' | b'-') {
                self.i += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).ok()?;
        if !float {
            if let Ok(v) = text.parse::<i64>() {
                return Some(Num::Int(v));
            }
            if let Ok(v) = text.parse::<u64>() {
                return Some(Num::UInt(v));
            }
        }
        let f: f64 = text.parse().ok()?;
        if !f.is_finite() {
            return None; // orjson refuses infinities
        }
        Some(Num::Float(f))
    }

    fn value(&mut self, node: &Node, out: &mut Vec<u8>) -> bool {
        match node {
            Node::Null => self.peek() == b'n' && self.lit(b"null"),
            Node::Boolean => {
                if self.lit(b"true") {
                    out.push(1);
                    true
                } else if self.lit(b"false") {
                    out.push(0);
                    true
                } else {
                    false
                }
            }
            Node::Int | Node::Long => {
                if !matches!(self.peek(), b'-' | b'0'..=b'9') {
                    return false;
                }
                match self.number() {
                    Some(Num::Int(x)) => {
                        if matches!(node, Node::Int) {
                            if x < i32::MIN as i64 || x > i32::MAX as i64 {
                                return false;
                            }
                            varint(out, ((x << 1) ^ (x >> 31)) as u64);
                        } else {
                            varint(out, ((x << 1) ^ (x >> 63)) as u64);
                        }
                        true
                    }
                    _ => false,
                }
            }
            Node::Float | Node::Double => {
                if !matches!(self.peek(), b'-' | b'0'..=b'9') {
                    return false;
                }
                let f = match self.number() {
                    Some(Num::Int(x)) => x as f64,
                    Some(Num::UInt(x)) => x as f64,
                    Some(Num::Float(f)) => f,
                    None => return false,
                };
                if matches!(node, Node::Float) {
                    if f.abs() > FLT_MAX {
                        return false;
                    }
                    out.extend_from_slice(&(f as f32).to_le_bytes());
                } else {
                    out.extend_from_slice(&f.to_le_bytes());
                }
                true
            }
            Node::String => {
                if self.peek() != b'"' {
                    return false;
                }
                let Some(span) = self.string() else {
                    return false;
                };
                let b = self.str_bytes(span);
                varint(out, (b.len() as u64) << 1);
                out.extend_from_slice(b);
                true
            }
            Node::BytesLatin1 | Node::FixedLatin1(_) => {
                if self.peek() != b'"' {
                    return false;
                }
                let Some(span) = self.string() else {
                    return false;
                };
                let text = std::str::from_utf8(self.str_bytes(span)).unwrap_or("\u{100}");
                let mut b = Vec::with_capacity(text.len());
                for c in text.chars() {
                    if c as u32 > 0xFF {
                        return false;
                    }
                    b.push(c as u32 as u8);
                }
                match node {
                    Node::FixedLatin1(size) if b.len() != *size => return false,
                    Node::FixedLatin1(_) => {}
                    _ => varint(out, (b.len() as u64) << 1),
                }
                out.extend_from_slice(&b);
                true
            }
            Node::Enum(symbols) => {
                if self.peek() != b'"' {
                    return false;
                }
                let Some(span) = self.string() else {
                    return false;
                };
                let Ok(name) = std::str::from_utf8(self.str_bytes(span)) else {
                    return false;
                };
                match symbols.get(name) {
                    Some(b) => {
                        out.extend_from_slice(b);
                        true
                    }
                    None => false,
                }
            }
            Node::Array(item) => {
                if self.peek() != b'[' {
                    return false;
                }
                self.i += 1;
                self.ws();
                if self.peek() == b']' {
                    self.i += 1;
                    out.push(0);
                    return true;
                }
                let base = out.len();
                let mut n: u64 = 0;
                loop {
                    self.ws();
                    if !self.value(item, out) {
                        return false;
                    }
                    n += 1;
                    match self.next_item(b']') {
                        Some(false) => {}
                        Some(true) => break,
                        None => return false,
                    }
                }
                let mut count = Vec::with_capacity(4);
                varint(&mut count, n << 1);
                out.splice(base..base, count);
                out.push(0);
                true
            }
            Node::Record(fields) => self.record(fields, out),
            Node::Union(branches) => {
                let kind = match self.peek() {
                    b'n' => crate::JsonKind::Null,
                    b't' | b'f' => crate::JsonKind::Bool,
                    b'"' => crate::JsonKind::Str,
                    b'{' => crate::JsonKind::Dict,
                    b'[' => crate::JsonKind::List,
                    b'-' | b'0'..=b'9' => {
                        let save = self.i;
                        let k = match self.number() {
                            Some(Num::Float(_)) => crate::JsonKind::Float,
                            Some(_) => crate::JsonKind::Int,
                            None => return false,
                        };
                        self.i = save;
                        k
                    }
                    _ => return false,
                };
                for (k, index, branch) in branches {
                    if *k == kind {
                        out.extend_from_slice(index);
                        return self.value(branch, out);
                    }
                }
                false
            }
        }
    }

    fn record(&mut self, fields: &[(String, Node, Option<Vec<u8>>)], out: &mut Vec<u8>) -> bool {
        if self.peek() != b'{' || fields.len() > 32 {
            return false;
        }
        self.i += 1;
        let base = out.len();
        let mut spans = [(0u32, 0u32); 32];
        let mut seen: u32 = 0;
        let mut in_order = true;
        let mut last: isize = -1;
        self.ws();
        if self.peek() == b'}' {
            self.i += 1;
        } else {
            loop {
                self.ws();
                if self.peek() != b'"' {
                    return false;
                }
                let Some(span) = self.string() else {
                    return false;
                };
                let key = self.str_bytes(span);
                let Some(f) = fields
                    .iter()
                    .position(|(name, _, _)| name.as_bytes() == key)
                else {
                    return false; // not a field: the reference refuses it
                };
                if seen & (1 << f) != 0 {
                    return false; // a duplicate key: let the reference decide
                }
                seen |= 1 << f;
                self.ws();
                if self.peek() != b':' {
                    return false;
                }
                self.i += 1;
                self.ws();
                let start = out.len();
                if !self.value(&fields[f].1, out) {
                    return false;
                }
                spans[f] = (start as u32, out.len() as u32);
                if f as isize != last + 1 {
                    in_order = false;
                }
                last = f as isize;
                match self.next_item(b'}') {
                    Some(false) => {}
                    Some(true) => break,
                    None => return false,
                }
            }
        }
        let all = if fields.len() == 32 {
            u32::MAX
        } else {
            (1u32 << fields.len()) - 1
        };
        if in_order && seen == all {
            return true;
        }
        // Put the fields in schema order, with the defaults of those left out.
        self.tmp.clear();
        self.tmp.extend_from_slice(&out[base..]);
        out.truncate(base);
        for (f, (_, _, default)) in fields.iter().enumerate() {
            if seen & (1 << f) != 0 {
                let (a, b) = spans[f];
                out.extend_from_slice(&self.tmp[a as usize - base..b as usize - base]);
            } else if let Some(d) = default {
                out.extend_from_slice(d);
            } else {
                return false; // required and missing
            }
        }
        true
    }
}
