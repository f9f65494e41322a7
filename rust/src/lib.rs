//! `cdc._fastpath`: the compiled part of outbox CDC's hot path (issue 15; design in docs/compiled-loop.md).
//!
//! Today it holds one thing: an Avro encoder that writes a JSON payload as Avro in one scan, with no tree
//! built. It is only ever right or absent: wherever it is not sure the Python encoder (`cdc.avro.codegen`,
//! the reference) would accept the payload and write these very bytes, it calls that encoder instead, which
//! then writes the value or raises its own error with its own message. So it never has to reproduce an error.
//!
//! The schema stays in Python: `cdc.avro.compiled` turns the parsed schema the reference compiles into a
//! small tree of tuples (a "program"), with the reference's resolution and union order, and the defaults
//! already encoded by the reference. No schema text becomes code here either.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::collections::HashMap;

mod direct;
mod spans;

/// The JSON type of a value, as the reference's union dispatch sees it (Python's type names).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonKind {
    Str,
    Dict,
    Int,
    Null,
    Float,
    List,
    Bool,
}

/// What the reference's generated code does for one schema node.
pub(crate) enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    String,
    BytesLatin1,
    FixedLatin1(usize),
    Enum(HashMap<String, Vec<u8>>),
    Array(Box<Node>),
    // (name, node, the default's bytes as the reference writes them)
    Record(Vec<(String, Node, Option<Vec<u8>>)>),
    // JSON kind -> (encoded branch index, branch), in the reference's dispatch order; a kind absent is refused.
    Union(Vec<(JsonKind, Vec<u8>, Node)>),
}

pub(crate) const FLT_MAX: f64 = 3.4028234663852886e38;

pub(crate) fn varint(out: &mut Vec<u8>, mut z: u64) {
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn json_kind(name: &str) -> PyResult<JsonKind> {
    Ok(match name {
        "str" => JsonKind::Str,
        "dict" => JsonKind::Dict,
        "int" => JsonKind::Int,
        "NoneType" => JsonKind::Null,
        "float" => JsonKind::Float,
        "list" => JsonKind::List,
        "bool" => JsonKind::Bool,
        _ => return Err(PyValueError::new_err(format!("unknown JSON kind {name}"))),
    })
}

/// A program from `cdc.avro.compiled.program`: nested tuples `("kind", ...)`.
fn node_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Node> {
    let t = obj.downcast::<PyTuple>()?;
    let kind: String = t.get_item(0)?.extract()?;
    Ok(match kind.as_str() {
        "null" => Node::Null,
        "boolean" => Node::Boolean,
        "int" => Node::Int,
        "long" => Node::Long,
        "float" => Node::Float,
        "double" => Node::Double,
        "string" => Node::String,
        "bytes" => Node::BytesLatin1,
        "fixed" => Node::FixedLatin1(t.get_item(1)?.extract()?),
        "enum" => {
            let symbols: Vec<(String, Vec<u8>)> = t.get_item(1)?.extract()?;
            Node::Enum(symbols.into_iter().collect())
        }
        "array" => Node::Array(Box::new(node_from_py(&t.get_item(1)?)?)),
        "record" => {
            let mut fields = Vec::new();
            for f in t.get_item(1)?.downcast::<PyList>()?.iter() {
                let f = f.downcast::<PyTuple>()?.clone();
                let name: String = f.get_item(0)?.extract()?;
                let default: Option<Vec<u8>> = f.get_item(2)?.extract()?;
                fields.push((name, node_from_py(&f.get_item(1)?)?, default));
            }
            if fields.len() > 32 {
                return Err(PyValueError::new_err("a record of more than 32 fields"));
            }
            Node::Record(fields)
        }
        "union" => {
            let mut branches = Vec::new();
            for b in t.get_item(1)?.downcast::<PyList>()?.iter() {
                let b = b.downcast::<PyTuple>()?.clone();
                let k: String = b.get_item(0)?.extract()?;
                let index: Vec<u8> = b.get_item(1)?.extract()?;
                branches.push((json_kind(&k)?, index, node_from_py(&b.get_item(2)?)?));
            }
            Node::Union(branches)
        }
        other => return Err(PyValueError::new_err(format!("unsupported kind {other}"))),
    })
}

/// `Encoder(header, program, reference)(payload) -> bytes`: the header, then the Avro body of the payload.
/// A payload it is not sure of goes to `reference(payload)`, which returns the value or raises.
#[pyclass(frozen, module = "cdc._fastpath")]
struct Encoder {
    header: Vec<u8>,
    program: Node,
    reference: Py<PyAny>,
}

impl Encoder {
    fn write(&self, payload: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(self.header.len() + payload.len());
        out.extend_from_slice(&self.header);
        let mut scan = direct::Direct::new(payload)?;
        if scan.encode_document(&self.program, &mut out) {
            Some(out)
        } else {
            None
        }
    }

    fn compiled<'py>(&self, payload: &Bound<'py, PyAny>) -> Option<Vec<u8>> {
        // Exact types only: orjson.loads refuses a subclass of bytes or str as not JSON ("Input must be
        // bytes, bytearray, memoryview, or str"), so such a payload is the reference's to refuse.
        if let Ok(b) = payload.downcast_exact::<PyBytes>() {
            self.write(b.as_bytes())
        } else if let Ok(s) = payload.downcast_exact::<PyString>() {
            self.write(s.to_str().ok()?.as_bytes()) // a lone surrogate is not UTF-8: the reference decides
        } else {
            None // bytearray, memoryview, subclasses, anything else: the reference takes or refuses those
        }
    }
}

#[pymethods]
impl Encoder {
    #[new]
    fn new(header: Vec<u8>, program: &Bound<'_, PyAny>, reference: Py<PyAny>) -> PyResult<Self> {
        Ok(Encoder {
            header,
            program: node_from_py(program)?,
            reference,
        })
    }

    fn __call__<'py>(&self, py: Python<'py>, payload: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        match self.compiled(payload) {
            Some(out) => Ok(PyBytes::new(py, &out).into_any().unbind()),
            None => self.reference.call1(py, (payload,)),
        }
    }

    /// The compiled result alone, None where it would call the reference (for the differential tests).
    fn compiled_only<'py>(
        &self,
        py: Python<'py>,
        payload: &Bound<'py, PyAny>,
    ) -> Option<Py<PyBytes>> {
        self.compiled(payload)
            .map(|out| PyBytes::new(py, &out).unbind())
    }
}

/// `RowReader(oid, required, version, headers)(message) -> fields | None`: the outbox row of a whole
/// XLogData message holding a pgoutput Insert (`cdc.stream.pgoutput.decode_insert_tuple(data, offset=25)`
/// then `EventRouter.row_fields`), as the tuple `(id, aggregate_type, aggregate_id, event_type,
/// schema_version, payload, headers)`. None for anything else: another table, a row `row_fields` would
/// refuse, a value that is unchanged-TOAST or binary, a malformed message, a message that is not `bytes`.
/// The Python path then reads it, with its own errors and dead letters.
#[pyclass(frozen, module = "cdc._fastpath")]
struct RowReader {
    oid: u32,
    required: [usize; 5],
    version: Option<usize>,
    headers: Option<usize>,
    one: Py<PyBytes>,
}

const ENVELOPE: usize = 25; // 'w' + wal start, wal end, send time

/// The text values of an Insert's new tuple (None for SQL NULL); None when it is not one this reads.
fn insert_columns(d: &[u8], oid: u32, cols: &mut Vec<Option<(usize, usize)>>) -> Option<()> {
    if d.len() < ENVELOPE + 8 || d[0] != b'w' || d[ENVELOPE] != b'I' || d[ENVELOPE + 5] != b'N' {
        return None;
    }
    let rel = u32::from_be_bytes(d[ENVELOPE + 1..ENVELOPE + 5].try_into().ok()?);
    if rel != oid {
        return None;
    }
    let n = u16::from_be_bytes(d[ENVELOPE + 6..ENVELOPE + 8].try_into().ok()?) as usize;
    let mut p = ENVELOPE + 8;
    for _ in 0..n {
        match *d.get(p)? {
            b'n' => {
                cols.push(None);
                p += 1;
            }
            b't' => {
                let len = u32::from_be_bytes(d.get(p + 1..p + 5)?.try_into().ok()?) as usize;
                let end = (p + 5).checked_add(len)?;
                if end > d.len() {
                    return None;
                }
                cols.push(Some((p + 5, end)));
                p = end;
            }
            _ => return None, // 'u' unchanged TOAST, 'b' binary: the Python path decides
        }
    }
    if p != d.len() {
        return None;
    }
    Some(())
}

#[pymethods]
impl RowReader {
    #[new]
    #[pyo3(signature = (oid, required, version, headers))]
    fn new(
        py: Python<'_>,
        oid: u32,
        required: [usize; 5],
        version: Option<usize>,
        headers: Option<usize>,
    ) -> Self {
        RowReader {
            oid,
            required,
            version,
            headers,
            one: PyBytes::new(py, b"1").unbind(),
        }
    }

    /// Any object: only `bytes` (a subclass too) is read here. A `bytearray`, a `memoryview` or anything
    /// else gets None, so that the Python path gives its own answer (fields of that type, or its error):
    /// an argument error here would be a TypeError the Python path never raises.
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        message: &Bound<'py, PyAny>,
    ) -> Option<Bound<'py, PyTuple>> {
        let d = message.downcast::<PyBytes>().ok()?.as_bytes();
        let mut cols: Vec<Option<(usize, usize)>> = Vec::with_capacity(16);
        insert_columns(d, self.oid, &mut cols)?;
        let text = |p: usize| -> Option<Bound<'py, PyBytes>> {
            let (a, b) = (*cols.get(p)?)?;
            Some(PyBytes::new(py, &d[a..b]))
        };
        let version = match self.version {
            None => self.one.bind(py).clone(),
            Some(p) => {
                let (a, b) = (*cols.get(p)?)?;
                let v = &d[a..b];
                if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                    return None;
                }
                PyBytes::new(py, v)
            }
        };
        let headers = match self.headers {
            None => None,
            Some(p) => match *cols.get(p)? {
                None => None,
                Some((a, b)) => Some(PyBytes::new(py, &d[a..b])),
            },
        };
        let [id, at, aid, et, payload] = self.required;
        let fields = (
            text(id)?,
            text(at)?,
            text(aid)?,
            text(et)?,
            version,
            text(payload)?,
            headers,
        );
        fields.into_pyobject(py).ok()
    }
}

#[pymodule]
fn _fastpath(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Encoder>()?;
    m.add_class::<RowReader>()?;
    m.add_function(wrap_pyfunction!(spans::send_span, m)?)?;
    m.add_function(wrap_pyfunction!(spans::plain_child, m)?)?;
    Ok(())
}
