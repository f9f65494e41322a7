//! Prototype of issue 15 item 3: the pipeline's hot path in one compiled call per batch.
//!
//! pgoutput Insert (a whole XLogData CopyData message) -> outbox row fields -> route (cached by Python) ->
//! Avro body (a schema program compiled by Python from the same parsed schema the reference encoder uses)
//! -> Kafka key / value / headers, either handed back to Python (`process`) or produced straight through
//! librdkafka (`process_produce`), the librdkafka being confluent-kafka's own copy, found with dlopen.
//!
//! Anything the compiled path is not sure of (an unknown route, a row or payload the reference would refuse,
//! a schema shape it does not know, row headers that are not strings) is handed back as a "fallback" item:
//! Python runs the reference path on that message. The compiled path is only ever right or absent.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use serde_json::Value;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

mod direct;

// ---------------------------------------------------------------------------------------------------------
// The Avro program: what cdc.avro.codegen's generated Python does, as a tree.

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
    Map(Box<Node>),
    Record(Vec<(String, Node, Option<Vec<u8>>)>),
    // JSON kind -> (encoded branch index, branch); a kind absent is refused.
    Union(Vec<(JsonKind, Vec<u8>, Node)>),
}

pub(crate) fn varint(out: &mut Vec<u8>, mut z: u64) {
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn kind_of(v: &Value) -> JsonKind {
    match v {
        Value::Null => JsonKind::Null,
        Value::Bool(_) => JsonKind::Bool,
        Value::Number(n) => {
            if n.is_f64() {
                JsonKind::Float
            } else {
                JsonKind::Int
            }
        }
        Value::String(_) => JsonKind::Str,
        Value::Array(_) => JsonKind::List,
        Value::Object(_) => JsonKind::Dict,
    }
}

pub(crate) const FLT_MAX: f64 = 3.4028234663852886e38;

/// Write `v` as `node`; false when the reference encoder would refuse it (the caller falls back).
fn encode(node: &Node, v: &Value, out: &mut Vec<u8>) -> bool {
    match node {
        Node::Null => v.is_null(),
        Node::Boolean => match v {
            Value::Bool(b) => {
                out.push(*b as u8);
                true
            }
            _ => false,
        },
        Node::Int => match v {
            Value::Number(n) if !n.is_f64() => match n.as_i64() {
                Some(x) if (i32::MIN as i64..=i32::MAX as i64).contains(&x) => {
                    varint(out, ((x << 1) ^ (x >> 31)) as u64);
                    true
                }
                _ => false,
            },
            _ => false,
        },
        Node::Long => match v {
            Value::Number(n) if !n.is_f64() => match n.as_i64() {
                Some(x) => {
                    varint(out, ((x << 1) ^ (x >> 63)) as u64);
                    true
                }
                None => false,
            },
            _ => false,
        },
        Node::Float | Node::Double => {
            let f = match v {
                Value::Number(n) => {
                    if let Some(i) = n.as_i64() {
                        i as f64
                    } else if let Some(u) = n.as_u64() {
                        u as f64
                    } else {
                        n.as_f64().unwrap()
                    }
                }
                _ => return false,
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
        Node::String => match v {
            Value::String(s) => {
                varint(out, (s.len() as u64) << 1);
                out.extend_from_slice(s.as_bytes());
                true
            }
            _ => false,
        },
        Node::BytesLatin1 | Node::FixedLatin1(_) => match v {
            Value::String(s) => {
                let mut b = Vec::with_capacity(s.len());
                for c in s.chars() {
                    if (c as u32) > 0xFF {
                        return false;
                    }
                    b.push(c as u32 as u8);
                }
                if let Node::FixedLatin1(size) = node {
                    if b.len() != *size {
                        return false;
                    }
                } else {
                    varint(out, (b.len() as u64) << 1);
                }
                out.extend_from_slice(&b);
                true
            }
            _ => false,
        },
        Node::Enum(symbols) => match v {
            Value::String(s) => match symbols.get(s.as_str()) {
                Some(b) => {
                    out.extend_from_slice(b);
                    true
                }
                None => false,
            },
            _ => false,
        },
        Node::Array(item) => match v {
            Value::Array(a) => {
                if !a.is_empty() {
                    varint(out, (a.len() as u64) << 1);
                    for y in a {
                        if !encode(item, y, out) {
                            return false;
                        }
                    }
                }
                out.push(0);
                true
            }
            _ => false,
        },
        Node::Map(value) => match v {
            Value::Object(m) => {
                if !m.is_empty() {
                    varint(out, (m.len() as u64) << 1);
                    for (k, y) in m {
                        varint(out, (k.len() as u64) << 1);
                        out.extend_from_slice(k.as_bytes());
                        if !encode(value, y, out) {
                            return false;
                        }
                    }
                }
                out.push(0);
                true
            }
            _ => false,
        },
        Node::Record(fields) => match v {
            Value::Object(m) => {
                let mut matched = 0usize;
                for (name, field, default) in fields {
                    match m.get(name.as_str()) {
                        Some(y) => {
                            matched += 1;
                            if !encode(field, y, out) {
                                return false;
                            }
                        }
                        None => match default {
                            Some(d) => out.extend_from_slice(d),
                            None => return false,
                        },
                    }
                }
                matched == m.len() // a key that is not a field: the reference refuses it
            }
            _ => false,
        },
        Node::Union(branches) => {
            let k = kind_of(v);
            for (kind, index, branch) in branches {
                if *kind == k {
                    out.extend_from_slice(index);
                    return encode(branch, v, out);
                }
            }
            false
        }
    }
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

/// The program from Python (prototypes/compiled_loop/program.py): nested tuples ("kind", ...).
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
        "map" => Node::Map(Box::new(node_from_py(&t.get_item(1)?)?)),
        "record" => {
            let mut fields = Vec::new();
            for f in t.get_item(1)?.downcast::<PyList>()?.iter() {
                let f = f.downcast::<PyTuple>()?.clone();
                let name: String = f.get_item(0)?.extract()?;
                let default: Option<Vec<u8>> = f.get_item(2)?.extract()?;
                fields.push((name, node_from_py(&f.get_item(1)?)?, default));
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

// ---------------------------------------------------------------------------------------------------------
// pgoutput

const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

fn u32_at(d: &[u8], p: usize) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(p..p + 4)?.try_into().ok()?))
}

/// A tuple value: Some(Some(text)) for 't', Some(None) for anything else ('n', 'u', 'b').
type Col<'a> = Option<&'a [u8]>;

/// `decode_insert_tuple(data, offset=25)` of cdc.stream.pgoutput: None where it would raise.
fn decode_insert_into<'a>(data: &'a [u8], cols: &mut Vec<Col<'a>>) -> Option<u32> {
    // 'w' + 24 bytes of envelope; then 'I', oid, 'N', TupleData; nothing may trail.
    if data.len() < 25 + 8 || data[25] != b'I' || data[30] != b'N' {
        return None;
    }
    let oid = u32_at(data, 26)?;
    let count = u16::from_be_bytes([data[31], data[32]]) as usize;
    let mut pos = 33;
    cols.clear();
    for _ in 0..count {
        let kind = *data.get(pos)?;
        match kind {
            b't' | b'b' => {
                let len = u32_at(data, pos + 1)? as usize;
                let start = pos + 5;
                let end = start.checked_add(len)?;
                if end > data.len() {
                    return None;
                }
                cols.push(if kind == b't' { Some(&data[start..end]) } else { None });
                pos = end;
            }
            b'n' | b'u' => {
                cols.push(None);
                pos += 1;
            }
            _ => return None,
        }
    }
    if pos != data.len() {
        return None;
    }
    Some(oid)
}

fn format_lsn(lsn: u64) -> Vec<u8> {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF).into_bytes()
}

// ---------------------------------------------------------------------------------------------------------
// librdkafka, confluent-kafka's copy, through dlopen/dlsym

#[repr(C)]
#[derive(Clone, Copy)]
struct HeaderU {
    name: *const c_char,
    val: *const c_void,
    size: isize,
}

#[repr(C)]
#[derive(Clone, Copy)]
union VuU {
    cstr: *const c_char,
    ptr: *mut c_void,
    i: c_int,
    i64_: i64,
    mem: (*const c_void, usize),
    header: HeaderU,
    _pad: [u8; 64],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Vu {
    vtype: c_int,
    u: VuU,
}

const VT_RKT: c_int = 2;
const VT_VALUE: c_int = 4;
const VT_KEY: c_int = 5;
const VT_OPAQUE: c_int = 6;
const VT_MSGFLAGS: c_int = 7;
const VT_TIMESTAMP: c_int = 8;
const VT_HEADER: c_int = 9;
const MSG_F_COPY: c_int = 0x2;
const ERR_QUEUE_FULL: c_int = -184;

#[repr(C)]
struct RkMessage {
    err: c_int,
    rkt: *mut c_void,
    partition: i32,
    payload: *mut c_void,
    len: usize,
    key: *mut c_void,
    key_len: usize,
    offset: i64,
    private: *mut c_void,
}

type DrMsgCb = unsafe extern "C" fn(*mut c_void, *const RkMessage, *mut c_void);

struct Rk {
    conf_new: unsafe extern "C" fn() -> *mut c_void,
    conf_set: unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char, *mut c_char, usize) -> c_int,
    conf_set_dr_msg_cb: unsafe extern "C" fn(*mut c_void, DrMsgCb),
    conf_set_opaque: unsafe extern "C" fn(*mut c_void, *mut c_void),
    new: unsafe extern "C" fn(c_int, *mut c_void, *mut c_char, usize) -> *mut c_void,
    topic_new: unsafe extern "C" fn(*mut c_void, *const c_char, *mut c_void) -> *mut c_void,
    produceva: unsafe extern "C" fn(*mut c_void, *const Vu, usize) -> *mut c_void,
    error_code: unsafe extern "C" fn(*const c_void) -> c_int,
    error_destroy: unsafe extern "C" fn(*mut c_void),
    poll: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    flush: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    outq_len: unsafe extern "C" fn(*mut c_void) -> c_int,
    destroy: unsafe extern "C" fn(*mut c_void),
    version_str: unsafe extern "C" fn() -> *const c_char,
}

unsafe fn sym<T: Copy>(lib: *mut c_void, name: &str) -> PyResult<T> {
    let c = CString::new(name).unwrap();
    let p = libc::dlsym(lib, c.as_ptr());
    if p.is_null() {
        return Err(PyRuntimeError::new_err(format!("{name} not found in librdkafka")));
    }
    Ok(std::mem::transmute_copy(&p))
}

impl Rk {
    fn load(path: &str) -> PyResult<Rk> {
        let c = CString::new(path).unwrap();
        // RTLD_NOLOAD: only the copy confluent_kafka's cimpl already loaded, never a second one.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return Err(PyRuntimeError::new_err(format!("{path} is not loaded (import confluent_kafka first)")));
        }
        unsafe {
            Ok(Rk {
                conf_new: sym(lib, "rd_kafka_conf_new")?,
                conf_set: sym(lib, "rd_kafka_conf_set")?,
                conf_set_dr_msg_cb: sym(lib, "rd_kafka_conf_set_dr_msg_cb")?,
                conf_set_opaque: sym(lib, "rd_kafka_conf_set_opaque")?,
                new: sym(lib, "rd_kafka_new")?,
                topic_new: sym(lib, "rd_kafka_topic_new")?,
                produceva: sym(lib, "rd_kafka_produceva")?,
                error_code: sym(lib, "rd_kafka_error_code")?,
                error_destroy: sym(lib, "rd_kafka_error_destroy")?,
                poll: sym(lib, "rd_kafka_poll")?,
                flush: sym(lib, "rd_kafka_flush")?,
                outq_len: sym(lib, "rd_kafka_outq_len")?,
                destroy: sym(lib, "rd_kafka_destroy")?,
                version_str: sym(lib, "rd_kafka_version_str")?,
            })
        }
    }
}

/// Delivery reports, aggregated: per transaction token, how many were acknowledged; the failures apart.
#[derive(Default)]
struct Reports {
    acked: HashMap<u64, u64>,
    failed: Vec<(u64, c_int, i64)>,
}

unsafe extern "C" fn on_delivery(_rk: *mut c_void, m: *const RkMessage, opaque: *mut c_void) {
    let reports = &mut *(opaque as *mut Reports);
    let m = &*m;
    let token = m.private as u64;
    if m.err == 0 && m.offset >= 0 {
        *reports.acked.entry(token).or_insert(0) += 1;
    } else {
        // offset < 0 on success: an implicit acknowledgement, not a broker's (checkpoint.IMPLICIT_ACK)
        reports.failed.push((token, m.err, m.offset));
    }
}

struct Producer {
    rk: Rk,
    handle: *mut c_void,
    reports: Box<Reports>,
    topics: Vec<*mut c_void>,
}

// libpq, psycopg's copy (psycopg_binary.libs) or the system's: whichever psycopg loaded

struct Pq {
    get_copy_data: unsafe extern "C" fn(*mut c_void, *mut *mut c_char, c_int) -> c_int,
    freemem: unsafe extern "C" fn(*mut c_void),
    consume_input: unsafe extern "C" fn(*mut c_void) -> c_int,
    socket: unsafe extern "C" fn(*mut c_void) -> c_int,
}

impl Pq {
    fn load(path: &str) -> PyResult<Pq> {
        let c = CString::new(path).unwrap();
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if lib.is_null() {
            return Err(PyRuntimeError::new_err(format!("{path} is not loaded")));
        }
        unsafe {
            Ok(Pq {
                get_copy_data: sym(lib, "PQgetCopyData")?,
                freemem: sym(lib, "PQfreemem")?,
                consume_input: sym(lib, "PQconsumeInput")?,
                socket: sym(lib, "PQsocket")?,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------------------

struct Route {
    header: Vec<u8>,
    program: Node,
}

#[pyclass(unsendable)]
struct FastPath {
    outbox_oid: Option<u32>,
    pos: [usize; 5], // id, aggregate_type, aggregate_id, event_type, payload
    pos_version: Option<usize>,
    pos_headers: Option<usize>,
    routes: HashMap<(Vec<u8>, Vec<u8>, Vec<u8>), usize>,
    route_list: Vec<Route>,
    txn_lsn: Vec<u8>,
    txn_xid: Vec<u8>,
    txn_ts_ms: i64,
    txn_token: u64,
    producer: Option<Producer>,
    pq: Option<Pq>,
    /// serde_json's Value, then the tree walk (the first version), instead of the direct scan.
    #[pyo3(get, set)]
    dom: bool,
}

enum Outcome<'a> {
    Event {
        route: usize,
        key: &'a [u8],
        value: Vec<u8>,
        headers: Vec<(&'static [u8], &'a [u8])>,
        row_headers: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Fallback,
    NotOutbox,
}

const SYSTEM_HEADERS: [&str; 10] = [
    "id",
    "event_type",
    "schema_version",
    "aggregate_type",
    "commit_lsn",
    "xid",
    "error_class",
    "error_reason",
    "error_message",
    "original_topic",
];

/// `parse_headers` of cdc.stream.route for the common shape: an object of strings (nulls skipped). None
/// for anything else: the reference decides (warnings, orjson.dumps of other values).
fn row_headers(raw: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let v: Value = serde_json::from_slice(raw).ok()?;
    let m = match v {
        Value::Object(m) => m,
        _ => return None,
    };
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        match v {
            Value::Null => continue,
            Value::String(s) => {
                let name = if SYSTEM_HEADERS.contains(&k.as_str()) || k.starts_with("cdc_") {
                    format!("row_{k}")
                } else {
                    k
                };
                out.push((name.into_bytes(), s.into_bytes()));
            }
            _ => return None,
        }
    }
    Some(out)
}

impl FastPath {
    fn event<'a>(&self, data: &'a [u8], cols: &mut Vec<Col<'a>>, value: &mut Vec<u8>) -> Outcome<'a> {
        let oid = match decode_insert_into(data, cols) {
            Some(o) => o,
            None => return Outcome::Fallback, // the reference raises the ProtocolError
        };
        if Some(oid) != self.outbox_oid {
            return Outcome::NotOutbox;
        }
        let get = |p: usize| -> Option<&'a [u8]> { cols.get(p).copied().flatten() };
        let (Some(id), Some(at), Some(aid), Some(et), Some(payload)) = (
            get(self.pos[0]),
            get(self.pos[1]),
            get(self.pos[2]),
            get(self.pos[3]),
            get(self.pos[4]),
        ) else {
            return Outcome::Fallback; // null, unsent or missing: a dead letter, by the reference
        };
        let version: &[u8] = match self.pos_version {
            None => b"1",
            Some(p) => match get(p) {
                Some(v) if !v.is_empty() && v.iter().all(u8::is_ascii_digit) => v,
                _ => return Outcome::Fallback,
            },
        };
        let raw_headers = self.pos_headers.and_then(get);
        let route = match self.routes.get(&(at.to_vec(), et.to_vec(), version.to_vec())) {
            Some(r) => *r,
            None => return Outcome::Fallback, // Python makes the route (topic, schema, registry id)
        };
        let r = &self.route_list[route];
        value.clear();
        value.extend_from_slice(&r.header);
        if self.dom {
            let parsed: Value = match serde_json::from_slice(payload) {
                Ok(v) => v,
                Err(_) => return Outcome::Fallback,
            };
            if !encode(&r.program, &parsed, value) {
                return Outcome::Fallback;
            }
        } else {
            let ok = match direct::Direct::new(payload) {
                Some(mut d) => d.encode_document(&r.program, value),
                None => false,
            };
            if !ok {
                return Outcome::Fallback;
            }
        }
        let row_headers = match raw_headers {
            None => Vec::new(),
            Some(raw) => match row_headers(raw) {
                Some(h) => h,
                None => return Outcome::Fallback,
            },
        };
        Outcome::Event {
            route,
            key: aid,
            value: std::mem::take(value),
            headers: vec![
                (b"id", id),
                (b"event_type", et),
                (b"schema_version", version),
                (b"aggregate_type", at),
            ],
            row_headers,
        }
    }

    /// rd_kafka_produceva of one event; waits (polling) while the queue is full.
    fn produce_one(&mut self, route: usize, key: &[u8], v: &[u8], headers: &[(&'static [u8], &[u8])], row_headers: &[(Vec<u8>, Vec<u8>)], vus: &mut Vec<Vu>) -> PyResult<()> {
        let p = self.producer.as_mut().ok_or_else(|| PyRuntimeError::new_err("no producer"))?;
        vus.clear();
        let mut push = |vtype: c_int, set: &dyn Fn(&mut VuU)| {
            let mut u = VuU { _pad: [0; 64] };
            set(&mut u);
            vus.push(Vu { vtype, u })
        };
        let rkt = p.topics[route];
        push(VT_RKT, &|u| u.ptr = rkt);
        push(VT_KEY, &|u| u.mem = (key.as_ptr() as *const c_void, key.len()));
        push(VT_VALUE, &|u| u.mem = (v.as_ptr() as *const c_void, v.len()));
        push(VT_MSGFLAGS, &|u| u.i = MSG_F_COPY);
        let ts = self.txn_ts_ms;
        push(VT_TIMESTAMP, &|u| u.i64_ = ts);
        let token = self.txn_token;
        push(VT_OPAQUE, &|u| u.ptr = token as *mut c_void);
        const HNAMES: [&CStr; 6] = [c"id", c"event_type", c"schema_version", c"aggregate_type", c"commit_lsn", c"xid"];
        let vals = [headers[0].1, headers[1].1, headers[2].1, headers[3].1, &self.txn_lsn[..], &self.txn_xid[..]];
        for (n, val) in HNAMES.iter().zip(vals) {
            push(VT_HEADER, &|u| {
                u.header = HeaderU { name: n.as_ptr(), val: val.as_ptr() as *const c_void, size: val.len() as isize }
            });
        }
        let names: Vec<CString> = row_headers.iter().map(|(n, _)| CString::new(n.clone()).unwrap_or_default()).collect();
        for (k, (_, val)) in row_headers.iter().enumerate() {
            let name = names[k].as_ptr();
            push(VT_HEADER, &|u| u.header = HeaderU { name, val: val.as_ptr() as *const c_void, size: val.len() as isize });
        }
        loop {
            let e = unsafe { (p.rk.produceva)(p.handle, vus.as_ptr(), vus.len()) };
            if e.is_null() {
                return Ok(());
            }
            let code = unsafe { (p.rk.error_code)(e) };
            unsafe { (p.rk.error_destroy)(e) };
            if code != ERR_QUEUE_FULL {
                return Err(PyRuntimeError::new_err(format!("produce failed: error {code}")));
            }
            // The Python sink also keeps the replication connection alive here.
            unsafe { (p.rk.poll)(p.handle, 50) };
        }
    }

    /// Begin: the transaction's headers and timestamp. Returns false when it is not a Begin.
    fn begin(&mut self, data: &[u8]) -> bool {
        if data.len() != 25 + 21 || data[25] != b'B' {
            return false;
        }
        let final_lsn = u64::from_be_bytes(data[26..34].try_into().unwrap());
        let time = i64::from_be_bytes(data[34..42].try_into().unwrap());
        let xid = u32::from_be_bytes(data[42..46].try_into().unwrap());
        self.txn_lsn = format_lsn(final_lsn);
        self.txn_xid = xid.to_string().into_bytes();
        self.txn_ts_ms = (time + PG_EPOCH_OFFSET_US).div_euclid(1000);
        self.txn_token += 1;
        true
    }
}

#[pymethods]
impl FastPath {
    #[new]
    fn py_new() -> Self {
        FastPath {
            outbox_oid: None,
            pos: [0; 5],
            pos_version: None,
            pos_headers: None,
            routes: HashMap::new(),
            route_list: Vec::new(),
            txn_lsn: Vec::new(),
            txn_xid: Vec::new(),
            txn_ts_ms: 0,
            txn_token: 0,
            producer: None,
            pq: None,
            dom: false,
        }
    }

    /// The outbox table's relation id and the positions EventRouter.relation() found.
    fn set_layout(
        &mut self,
        oid: u32,
        pos: (usize, usize, usize, usize, usize),
        pos_version: Option<usize>,
        pos_headers: Option<usize>,
    ) {
        self.outbox_oid = Some(oid);
        self.pos = [pos.0, pos.1, pos.2, pos.3, pos.4];
        self.pos_version = pos_version;
        self.pos_headers = pos_headers;
    }

    /// A route Python made: (aggregate_type, event_type, version) -> (value header, schema program,
    /// topic). Returns its id.
    fn add_route(
        &mut self,
        aggregate_type: Vec<u8>,
        event_type: Vec<u8>,
        version: Vec<u8>,
        header: Vec<u8>,
        program: &Bound<'_, PyAny>,
        topic: &str,
    ) -> PyResult<usize> {
        let program = node_from_py(program)?;
        let id = self.route_list.len();
        self.route_list.push(Route { header, program });
        if let Some(p) = &mut self.producer {
            let c = CString::new(topic).unwrap();
            let rkt = unsafe { (p.rk.topic_new)(p.handle, c.as_ptr(), std::ptr::null_mut()) };
            if rkt.is_null() {
                return Err(PyRuntimeError::new_err("rd_kafka_topic_new failed"));
            }
            p.topics.push(rkt);
        }
        self.routes.insert((aggregate_type, event_type, version), id);
        Ok(id)
    }

    /// Set the transaction of the events that follow (as Pipeline._handle does on Begin).
    fn set_txn(&mut self, lsn: Vec<u8>, xid: Vec<u8>, ts_ms: i64, token: u64) {
        self.txn_lsn = lsn;
        self.txn_xid = xid;
        self.txn_ts_ms = ts_ms;
        self.txn_token = token;
    }

    /// One call per batch of CopyData messages. Items, in order: (route id, key, value, headers) for an
    /// event, or an int: the index of a message Python must handle itself (not an outbox Insert, or a
    /// fallback). A Begin is handled here too and also handed back (Python's tracker needs it).
    #[pyo3(signature = (messages, start=0))]
    fn process<'py>(&mut self, py: Python<'py>, messages: &Bound<'py, PyList>, start: usize) -> PyResult<(Bound<'py, PyList>, usize)> {
        let out = PyList::empty(py);
        let mut cols: Vec<Col> = Vec::with_capacity(16);
        let mut value = Vec::with_capacity(512);
        let msgs: Vec<Bound<'py, PyAny>> = messages.iter().collect();
        let mut stop = msgs.len();
        for (i, m) in msgs.iter().enumerate().skip(start) {
            let b = m.downcast::<PyBytes>()?;
            let data = b.as_bytes();
            if data.len() > 25 && data[0] == b'w' && data[25] == b'I' {
                match self.event(data, &mut cols, &mut value) {
                    Outcome::Event { route, key, value: v, headers, row_headers } => {
                        let h = PyList::empty(py);
                        for (name, val) in headers {
                            h.append((std::str::from_utf8(name).unwrap(), PyBytes::new(py, val)))?;
                        }
                        h.append(("commit_lsn", PyBytes::new(py, &self.txn_lsn)))?;
                        h.append(("xid", PyBytes::new(py, &self.txn_xid)))?;
                        for (name, val) in row_headers {
                            h.append((String::from_utf8(name).unwrap(), PyBytes::new(py, &val)))?;
                        }
                        out.append((route, PyBytes::new(py, key), PyBytes::new(py, &v), h))?;
                        value = v;
                    }
                    Outcome::NotOutbox => {}
                    Outcome::Fallback => out.append(i)?,
                }
            } else {
                if data.len() > 25 && data[0] == b'w' {
                    self.begin(data);
                }
                out.append(i)?;
                if data.len() > 25 && data[0] == b'w' && data[25] == b'R' {
                    stop = i + 1; // Python learns the layout before the Inserts that follow
                    break;
                }
            }
        }
        Ok((out, stop))
    }

    /// The compiled work alone (decode, fields, route, JSON parse, Avro encode, headers), nothing handed
    /// back: how many events it made. For the benchmark.
    fn encode_only(&mut self, messages: &Bound<'_, PyList>) -> PyResult<(usize, usize)> {
        let msgs: Vec<Bound<'_, PyAny>> = messages.iter().collect();
        let mut cols: Vec<Col> = Vec::with_capacity(16);
        let mut value = Vec::with_capacity(512);
        let (mut n, mut bytes) = (0, 0);
        for m in msgs.iter() {
            let data = m.downcast::<PyBytes>()?.as_bytes();
            if data.len() > 25 && data[0] == b'w' && data[25] == b'I' {
                if let Outcome::Event { value: v, .. } = self.event(data, &mut cols, &mut value) {
                    n += 1;
                    bytes += v.len();
                    value = v;
                }
            }
        }
        Ok((n, bytes))
    }

    /// serde_json parse alone of the payload column, for the benchmark.
    fn parse_only(&mut self, messages: &Bound<'_, PyList>) -> PyResult<usize> {
        let msgs: Vec<Bound<'_, PyAny>> = messages.iter().collect();
        let mut cols: Vec<Col> = Vec::with_capacity(16);
        let mut n = 0;
        for m in msgs.iter() {
            let data = m.downcast::<PyBytes>()?.as_bytes();
            if data.len() > 25 && data[0] == b'w' && data[25] == b'I' && decode_insert_into(data, &mut cols).is_some() {
                if let Some(Some(p)) = cols.get(self.pos[4]) {
                    if serde_json::from_slice::<Value>(p).is_ok() {
                        n += 1;
                    }
                }
            }
        }
        Ok(n)
    }

    /// Attach a producer on confluent-kafka's librdkafka (`path`: the loaded library, see fastpath.py).
    fn attach_producer(&mut self, path: &str, conf: Vec<(String, String)>) -> PyResult<String> {
        let rk = Rk::load(path)?;
        let mut reports = Box::new(Reports::default());
        let mut err = [0 as c_char; 512];
        unsafe {
            let c = (rk.conf_new)();
            for (k, v) in &conf {
                let (kc, vc) = (CString::new(k.as_str()).unwrap(), CString::new(v.as_str()).unwrap());
                if (rk.conf_set)(c, kc.as_ptr(), vc.as_ptr(), err.as_mut_ptr(), err.len()) != 0 {
                    let e = CStr::from_ptr(err.as_ptr()).to_string_lossy().into_owned();
                    return Err(PyValueError::new_err(format!("{k}: {e}")));
                }
            }
            (rk.conf_set_dr_msg_cb)(c, on_delivery);
            (rk.conf_set_opaque)(c, &mut *reports as *mut Reports as *mut c_void);
            let handle = (rk.new)(0, c, err.as_mut_ptr(), err.len());
            if handle.is_null() {
                let e = CStr::from_ptr(err.as_ptr()).to_string_lossy().into_owned();
                return Err(PyRuntimeError::new_err(e));
            }
            let version = CStr::from_ptr((rk.version_str)()).to_string_lossy().into_owned();
            self.producer = Some(Producer { rk, handle, reports, topics: Vec::new() });
            Ok(version)
        }
    }

    /// As process(), but events are produced here, one rd_kafka_produceva each (key, value, headers,
    /// the transaction's commit timestamp, the transaction token as the per-message opaque), and not
    /// handed back: the items are only the indexes Python must handle. Then one rd_kafka_poll(0).
    #[pyo3(signature = (messages, start=0))]
    fn process_produce<'py>(&mut self, py: Python<'py>, messages: &Bound<'py, PyList>, start: usize) -> PyResult<(Bound<'py, PyList>, usize)> {
        let out = PyList::empty(py);
        let mut cols: Vec<Col> = Vec::with_capacity(16);
        let mut value = Vec::with_capacity(512);
        let mut vus: Vec<Vu> = Vec::with_capacity(24);
        let msgs: Vec<Bound<'py, PyAny>> = messages.iter().collect();
        let mut stop = msgs.len();
        for (i, m) in msgs.iter().enumerate().skip(start) {
            let b = m.downcast::<PyBytes>()?;
            let data = b.as_bytes();
            if data.len() > 25 && data[0] == b'w' && data[25] == b'I' {
                match self.event(data, &mut cols, &mut value) {
                    Outcome::Event { route, key, value: v, headers, row_headers } => {
                        let r = self.produce_one(route, key, &v, &headers, &row_headers, &mut vus);
                        r?;
                        value = v;
                    }
                    Outcome::NotOutbox => {}
                    Outcome::Fallback => out.append(i)?,
                }
            } else {
                if data.len() > 25 && data[0] == b'w' {
                    self.begin(data);
                }
                out.append(i)?;
                if data.len() > 25 && data[0] == b'w' && data[25] == b'R' {
                    stop = i + 1; // Python learns the layout before the Inserts that follow
                    break;
                }
            }
        }
        if let Some(p) = &self.producer {
            unsafe { (p.rk.poll)(p.handle, 0) };
        }
        Ok((out, stop))
    }

    /// librdkafka alone: `n` times the same record (6 headers of `header_len` bytes, or none), one
    /// rd_kafka_produceva each, rd_kafka_poll(0) every 500. For the benchmark.
    fn produce_same(&mut self, n: usize, route: usize, key: Vec<u8>, value: Vec<u8>, headers: usize) -> PyResult<()> {
        let p = self.producer.as_mut().ok_or_else(|| PyRuntimeError::new_err("no producer"))?;
        let hval = b"0123456789abcdef0123456789abcdef0123";
        const HNAMES: [&CStr; 6] = [c"id", c"event_type", c"schema_version", c"aggregate_type", c"commit_lsn", c"xid"];
        let mut vus: Vec<Vu> = Vec::new();
        let mut push = |vtype: c_int, set: &dyn Fn(&mut VuU)| {
            let mut u = VuU { _pad: [0; 64] };
            set(&mut u);
            vus.push(Vu { vtype, u })
        };
        let rkt = p.topics[route];
        push(VT_RKT, &|u| u.ptr = rkt);
        push(VT_KEY, &|u| u.mem = (key.as_ptr() as *const c_void, key.len()));
        push(VT_VALUE, &|u| u.mem = (value.as_ptr() as *const c_void, value.len()));
        push(VT_MSGFLAGS, &|u| u.i = MSG_F_COPY);
        push(VT_TIMESTAMP, &|u| u.i64_ = 1_700_000_000_000);
        push(VT_OPAQUE, &|u| u.ptr = 1 as *mut c_void);
        for n in HNAMES.iter().take(headers) {
            push(VT_HEADER, &|u| u.header = HeaderU { name: n.as_ptr(), val: hval.as_ptr() as *const c_void, size: 12 });
        }
        for i in 0..n {
            loop {
                let e = unsafe { (p.rk.produceva)(p.handle, vus.as_ptr(), vus.len()) };
                if e.is_null() {
                    break;
                }
                let code = unsafe { (p.rk.error_code)(e) };
                unsafe { (p.rk.error_destroy)(e) };
                if code != ERR_QUEUE_FULL {
                    return Err(PyRuntimeError::new_err(format!("produce failed: error {code}")));
                }
                unsafe { (p.rk.poll)(p.handle, 50) };
            }
            if i % 500 == 499 {
                unsafe { (p.rk.poll)(p.handle, 0) };
            }
        }
        Ok(())
    }

    /// The whole loop: read CopyData from the replication connection (psycopg's PGconn, by its pointer,
    /// through the libpq psycopg loaded), decode, encode and produce the outbox Inserts here; hand back, as
    /// bytes and in order, every message Python must see (Begin, Commit, Relation, keepalives, fallbacks).
    /// Returns after `max_messages`, after a Relation or a fallback (Python learns from it first), or when
    /// no data came within `timeout_ms`. Then one rd_kafka_poll(0). (events produced, [messages], ended)
    fn read_produce<'py>(&mut self, py: Python<'py>, libpq: &str, pgconn: usize, max_messages: usize, timeout_ms: i32) -> PyResult<(usize, Bound<'py, PyList>, bool)> {
        if self.pq.is_none() {
            self.pq = Some(Pq::load(libpq)?);
        }
        let (get_copy_data, freemem, consume_input, socket) = {
            let q = self.pq.as_ref().unwrap();
            (q.get_copy_data, q.freemem, q.consume_input, q.socket)
        };
        let conn = pgconn as *mut c_void;
        let out = PyList::empty(py);
        let mut cols: Vec<Col> = Vec::with_capacity(16);
        let mut value = Vec::with_capacity(512);
        let mut vus: Vec<Vu> = Vec::with_capacity(24);
        let (mut seen, mut produced, mut ended) = (0usize, 0usize, false);
        let mut wait = timeout_ms;
        'read: while seen < max_messages {
            let mut buf: *mut c_char = std::ptr::null_mut();
            let n = unsafe { get_copy_data(conn, &mut buf, 1) };
            if n > 0 {
                seen += 1;
                let data = unsafe { std::slice::from_raw_parts(buf as *const u8, n as usize) };
                let mut stop = false;
                let mut hand_back = true;
                if data.len() > 25 && data[0] == b'w' && data[25] == b'I' {
                    match self.event(data, &mut cols, &mut value) {
                        Outcome::Event { route, key, value: v, headers, row_headers } => {
                            // Without a producer: the read and the encoding alone (for the benchmark).
                            let r = if self.producer.is_some() {
                                self.produce_one(route, key, &v, &headers, &row_headers, &mut vus)
                            } else {
                                Ok(())
                            };
                            value = v;
                            if let Err(e) = r {
                                unsafe { freemem(buf as *mut c_void) };
                                return Err(e);
                            }
                            produced += 1;
                            hand_back = false;
                        }
                        Outcome::NotOutbox => hand_back = false,
                        Outcome::Fallback => stop = true,
                    }
                } else if data.len() > 25 && data[0] == b'w' {
                    self.begin(data);
                    stop = data[25] == b'R';
                }
                if hand_back {
                    out.append(PyBytes::new(py, data))?;
                }
                unsafe { freemem(buf as *mut c_void) };
                if stop {
                    break 'read;
                }
                wait = 0;
            } else if n == 0 {
                let mut pfd = libc::pollfd { fd: unsafe { socket(conn) }, events: libc::POLLIN, revents: 0 };
                let ready = py.detach(|| unsafe { libc::poll(&mut pfd, 1, wait) });
                if ready <= 0 {
                    break;
                }
                if unsafe { consume_input(conn) } == 0 {
                    return Err(PyRuntimeError::new_err("PQconsumeInput failed"));
                }
                wait = 0;
            } else {
                ended = true; // -1: the COPY ended; -2: an error (Python reads it from the connection)
                break;
            }
        }
        if let Some(p) = &self.producer {
            unsafe { (p.rk.poll)(p.handle, 0) };
        }
        Ok((produced, out, ended))
    }

    /// Serve delivery reports for up to `timeout_ms`; return and reset the aggregate:
    /// ({token: acknowledged}, [(token, error code, offset)], queue length).
    fn poll<'py>(&mut self, py: Python<'py>, timeout_ms: i32) -> PyResult<Bound<'py, PyTuple>> {
        let p = self.producer.as_mut().ok_or_else(|| PyRuntimeError::new_err("no producer"))?;
        let handle = p.handle as usize;
        let poll = p.rk.poll;
        py.detach(|| unsafe { poll(handle as *mut c_void, timeout_ms) });
        let acked: Vec<(u64, u64)> = p.reports.acked.drain().collect();
        let failed = std::mem::take(&mut p.reports.failed);
        let q = unsafe { (p.rk.outq_len)(p.handle) };
        (acked.into_iter().collect::<HashMap<u64, u64>>(), failed, q).into_pyobject(py)
    }

    fn flush(&mut self, py: Python<'_>, timeout_ms: i32) -> PyResult<i32> {
        let p = self.producer.as_mut().ok_or_else(|| PyRuntimeError::new_err("no producer"))?;
        let handle = p.handle as usize;
        let flush = p.rk.flush;
        Ok(py.detach(|| unsafe { flush(handle as *mut c_void, timeout_ms) }))
    }

    fn close(&mut self) {
        if let Some(p) = self.producer.take() {
            unsafe { (p.rk.destroy)(p.handle) };
        }
    }
}

#[pymodule]
fn cdc_fastpath(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FastPath>()?;
    Ok(())
}
