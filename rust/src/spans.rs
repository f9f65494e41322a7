//! The relay's `send` spans as OTLP protobuf: what `cdc.trace_export._send_span(*span.wire())` writes for a
//! `cdc.trace_span.SendSpan`, read from the span's own fields. It runs on the span exporter's thread, which
//! holds the GIL while it encodes (6 µs a span in Python, a tenth of that here).
//!
//! Only ever right or absent, as the rest of the extension: a span holding anything it is not sure of (an
//! attribute value that is not a string, a bool, an int64 or a float; text that is not UTF-8; a schema
//! version that is not plain digits; its attributes' dict already made) gives None, and the caller writes it
//! in Python, which then encodes it or raises its own error. `tests/unit/test_trace_export_compiled.py` holds
//! the two to the same bytes.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::varint;

/// A length-delimited field: its tag, its length, its bytes.
fn put(out: &mut Vec<u8>, field: u64, body: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// `cdc.trace_span._text`: None as "", bytes decoded (strictly here: what is not UTF-8 goes to Python,
/// whose decoding replaces it), a str as it is.
fn text(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    if value.is_none() {
        return Some(Vec::new());
    }
    if let Ok(bytes) = value.downcast::<PyBytes>() {
        let data = bytes.as_bytes();
        return std::str::from_utf8(data).ok().map(|_| data.to_vec());
    }
    string(value)
}

/// A str's UTF-8 bytes; None for anything else, or a str that has none (a lone surrogate).
fn string(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    Some(
        value
            .downcast::<PyString>()
            .ok()?
            .to_str()
            .ok()?
            .as_bytes()
            .to_vec(),
    )
}

/// `int(version)` where it is sure to be the same: an int within int64 (a bool is one), or bytes of 1 to 18
/// ASCII digits (Python's int() also takes signs, spaces and underscores: those go to Python).
fn version(value: &Bound<'_, PyAny>) -> Option<i64> {
    if value.is_instance_of::<PyInt>() {
        return value.extract::<i64>().ok();
    }
    let data = value.downcast::<PyBytes>().ok()?.as_bytes();
    if data.is_empty() || data.len() > 18 || !data.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(data).ok()?.parse::<i64>().ok()
}

/// A KeyValue of the span's attributes (field 9), its AnyValue's body given.
fn attribute(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let mut pair = Vec::with_capacity(key.len() + value.len() + 6);
    put(&mut pair, 1, key);
    put(&mut pair, 2, value);
    put(out, 9, &pair);
}

fn string_value(text: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(text.len() + 2);
    put(&mut value, 1, text);
    value
}

fn int_value(number: i64) -> Vec<u8> {
    let mut value = vec![0x18];
    varint(&mut value, number as u64); // two's complement, as int64 is written
    value
}

/// `cdc.trace_export._value` for the types it is sure of, in its order (a bool before an int).
fn any_value(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    if value.is_instance_of::<PyString>() {
        return Some(string_value(&string(value)?));
    }
    if let Ok(flag) = value.downcast::<PyBool>() {
        return Some(vec![0x10, u8::from(flag.is_true())]);
    }
    if value.is_instance_of::<PyInt>() {
        return value.extract::<i64>().ok().map(int_value);
    }
    if let Ok(number) = value.downcast::<PyFloat>() {
        let mut out = vec![0x21];
        out.extend_from_slice(&number.value().to_le_bytes());
        return Some(out);
    }
    if value.is_none() {
        return Some(Vec::new());
    }
    None
}

/// `send_span(span) -> bytes | None`: a SendSpan's `Span` message (field 2 of ScopeSpans, with its tag).
#[pyfunction]
pub(crate) fn send_span<'py>(
    py: Python<'py>,
    span: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    if !span.getattr(intern!(py, "_attributes")).ok()?.is_none() {
        return None; // read as a dict since: Python writes it from that dict
    }
    let topic = span.getattr(intern!(py, "_topic")).ok()?;
    let topic = string(&topic)?;
    let fields = span.getattr(intern!(py, "_fields")).ok()?;
    let fields = fields.downcast::<PyTuple>().ok()?;
    if fields.len() != 5 {
        return None;
    }
    let key = text(&fields.get_item(0).ok()?)?;
    let event_id = text(&fields.get_item(1).ok()?)?;
    let event_type = text(&fields.get_item(2).ok()?)?;
    let schema_version = version(&fields.get_item(3).ok()?)?;
    let lsn = fields.get_item(4).ok()?;
    let lsn = lsn.downcast::<PyBytes>().ok()?.as_bytes();
    std::str::from_utf8(lsn).ok()?;
    let trace_id: u128 = span
        .getattr(intern!(py, "_trace_id"))
        .ok()?
        .extract()
        .ok()?;
    let span_id: u64 = span.getattr(intern!(py, "span_id")).ok()?.extract().ok()?;
    let parent_id: u64 = span
        .getattr(intern!(py, "_parent_id"))
        .ok()?
        .extract()
        .ok()?;
    let start: u64 = span
        .getattr(intern!(py, "start_time"))
        .ok()?
        .extract()
        .ok()?;
    let end = span.getattr(intern!(py, "end_time")).ok()?;
    let end: u64 = if end.is_none() {
        0
    } else {
        end.extract().ok()?
    };
    let status = span.getattr(intern!(py, "status")).ok()?;
    let description = status.getattr(intern!(py, "description")).ok()?;
    let description = if description.is_none() {
        Vec::new()
    } else {
        string(&description)?
    };
    let code: u64 = status
        .getattr(intern!(py, "status_code"))
        .ok()?
        .getattr(intern!(py, "_value_")) // the member's own attribute: `value` is a property, in Python
        .ok()?
        .extract()
        .ok()?;
    let late = span.getattr(intern!(py, "_late")).ok()?;
    let late = late.downcast::<PyDict>().ok()?;

    let mut body = Vec::with_capacity(512);
    body.extend_from_slice(&[0x0a, 0x10]);
    body.extend_from_slice(&trace_id.to_be_bytes());
    body.extend_from_slice(&[0x12, 0x08]);
    body.extend_from_slice(&span_id.to_be_bytes());
    body.extend_from_slice(&[0x22, 0x08]);
    body.extend_from_slice(&parent_id.to_be_bytes());
    let mut name = b"send ".to_vec();
    name.extend_from_slice(&topic);
    put(&mut body, 5, &name);
    body.extend_from_slice(&[0x30, 0x04]); // kind: PRODUCER (3), plus one
    if start != 0 {
        body.push(0x39);
        body.extend_from_slice(&start.to_le_bytes());
    }
    if end != 0 {
        body.push(0x41);
        body.extend_from_slice(&end.to_le_bytes());
    }
    // cdc.trace_span.send_pairs, in its order, then what was set after the start, in its order.
    attribute(&mut body, b"messaging.system", &string_value(b"kafka"));
    attribute(
        &mut body,
        b"messaging.operation.type",
        &string_value(b"send"),
    );
    attribute(
        &mut body,
        b"messaging.destination.name",
        &string_value(&topic),
    );
    attribute(
        &mut body,
        b"messaging.kafka.message.key",
        &string_value(&key),
    );
    attribute(&mut body, b"messaging.message.id", &string_value(&event_id));
    attribute(&mut body, b"cdc.event_type", &string_value(&event_type));
    attribute(&mut body, b"cdc.schema_version", &int_value(schema_version));
    attribute(&mut body, b"cdc.commit_lsn", &string_value(lsn));
    for (k, v) in late.iter() {
        let k = string(&k)?;
        attribute(&mut body, &k, &any_value(&v)?);
    }
    let mut state = Vec::new();
    if !description.is_empty() {
        put(&mut state, 2, &description);
    }
    if code != 0 {
        state.push(0x18);
        varint(&mut state, code);
    }
    put(&mut body, 15, &state);
    body.extend_from_slice(&[0x85, 0x01, 0x00, 0x03, 0x00, 0x00]); // flags: has a parent that is remote
    let mut out = Vec::with_capacity(body.len() + 4);
    put(&mut out, 2, &body);
    Some(PyBytes::new(py, &out))
}

/// `cdc.trace_context.SAMPLED_PLAIN`: version 00, neither id all zeros, flags 01 or 03, nothing after.
fn sampled_plain(tp: &[u8]) -> bool {
    let hex = |part: &[u8]| {
        part.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    tp.len() == 55
        && tp.starts_with(b"00-")
        && tp[35] == b'-'
        && tp[52..54] == *b"-0"
        && (tp[54] == b'1' || tp[54] == b'3')
        && hex(&tp[3..35])
        && hex(&tp[36..52])
        && tp[3..35].iter().any(|&b| b != b'0')
        && tp[36..52].iter().any(|&b| b != b'0')
}

/// `plain_child(headers, first, span_id) -> bytes | None`: `cdc.trace_context.plain_child`, for a list of
/// (str, bytes | None) pairs. What it is not sure of (not a list, an item that is not a pair, an id that is
/// not a non-zero 64-bit int) gives None, as a traceparent it does not take does, and the list is left as it
/// came: the relay then takes its general path.
#[pyfunction]
pub(crate) fn plain_child<'py>(
    py: Python<'py>,
    headers: &Bound<'py, PyAny>,
    first: isize,
    span_id: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    let span_id: u64 = span_id.extract().ok()?;
    if span_id == 0 || first < 0 {
        return None;
    }
    let headers = headers.downcast_exact::<PyList>().ok()?;
    let mut found: Option<(usize, Bound<'py, PyAny>)> = None;
    for i in (first as usize)..headers.len() {
        let item = headers.get_item(i).ok()?;
        let pair = item.downcast_exact::<PyTuple>().ok()?;
        if pair.len() != 2 {
            return None;
        }
        let key = pair.get_item(0).ok()?;
        let Ok(key) = key.downcast_exact::<PyString>() else {
            continue; // not a str: never equal to one
        };
        match key.to_str().ok()? {
            "traceparent" => {
                if found.is_some() {
                    return None;
                }
                found = Some((i, pair.get_item(1).ok()?));
            }
            "tracestate" => return None,
            _ => {}
        }
    }
    let (index, value) = found?;
    let traceparent = value.downcast_exact::<PyBytes>().ok()?;
    let tp = traceparent.as_bytes();
    if !sampled_plain(tp) {
        return None;
    }
    let mut child = Vec::with_capacity(55);
    child.extend_from_slice(&tp[..36]);
    child.extend_from_slice(format!("{span_id:016x}").as_bytes());
    child.extend_from_slice(&tp[52..]);
    let pair = (intern!(py, "traceparent"), PyBytes::new(py, &child));
    headers.set_item(index, pair).ok()?;
    Some(traceparent.clone())
}
