package outbox.cdc.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.apache.avro.Conversions;
import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.data.TimeConversions;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericFixed;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.message.BinaryMessageDecoder;

/**
 * Decodes Kafka record values written by `cdc run`, the way a JVM consumer would.
 *
 * <pre>
 * java -cp ... outbox.cdc.interop.AvroDecode --schemas DIR [--registry URL]
 * </pre>
 *
 * <p>stdin: one record value a line, in hex. stdout: one JSON object a line, {"schema": full name,
 * "framing": "single-object" or "confluent", "value": the record} or {"error": why it could not be read}.
 * Avro strings, numbers, booleans and nulls are JSON's; records and maps are objects, arrays arrays; any other
 * Java value is an object {"class": its simple class name, "text": its toString()} (BigDecimal's
 * toPlainString), bytes and fixed {"class": "ByteBuffer" or "Fixed", "hex": ...}: the test compares the class
 * as well as the value, so a logical type that was not converted shows.
 */
public final class AvroDecode {
  private static final JsonNodeFactory JSON = JsonNodeFactory.instance;

  private final GenericData model = new GenericData();
  private final Map<Long, BinaryMessageDecoder<GenericRecord>> byFingerprint = new HashMap<>();
  private final Map<Integer, Schema> byId = new HashMap<>();
  private final String registry;
  private final HttpClient http = HttpClient.newHttpClient();
  private final ObjectMapper mapper = new ObjectMapper();

  AvroDecode(Path schemas, String registry) throws IOException {
    this.registry = registry;
    model.addLogicalTypeConversion(new Conversions.DecimalConversion());
    model.addLogicalTypeConversion(new Conversions.UUIDConversion());
    model.addLogicalTypeConversion(new TimeConversions.DateConversion());
    model.addLogicalTypeConversion(new TimeConversions.TimeMillisConversion());
    model.addLogicalTypeConversion(new TimeConversions.TimeMicrosConversion());
    model.addLogicalTypeConversion(new TimeConversions.TimestampMillisConversion());
    model.addLogicalTypeConversion(new TimeConversions.TimestampMicrosConversion());
    model.addLogicalTypeConversion(new TimeConversions.LocalTimestampMillisConversion());
    model.addLogicalTypeConversion(new TimeConversions.LocalTimestampMicrosConversion());
    List<Path> files;
    try (Stream<Path> walk = Files.walk(schemas)) {
      files = walk.filter(p -> p.getFileName().toString().endsWith(".avsc")).sorted().toList();
    }
    for (Path file : files) {
      Schema schema = new Schema.Parser().parse(file.toFile()); // a parser each: versions share names
      long fingerprint = SchemaNormalization.parsingFingerprint64(schema);
      byFingerprint.put(fingerprint, new BinaryMessageDecoder<>(model, schema));
    }
  }

  JsonNode decode(byte[] value) throws Exception {
    ObjectNode out = JSON.objectNode();
    GenericRecord record;
    if (value.length >= 10 && (value[0] & 0xff) == 0xc3 && value[1] == 0x01) {
      long fingerprint = ByteBuffer.wrap(value, 2, 8).order(java.nio.ByteOrder.LITTLE_ENDIAN).getLong();
      BinaryMessageDecoder<GenericRecord> decoder = byFingerprint.get(fingerprint);
      if (decoder == null) {
        throw new IllegalArgumentException("no schema file has the fingerprint " + Long.toHexString(fingerprint));
      }
      record = decoder.decode(value); // checks the header and the fingerprint again, Avro's way
      out.put("framing", "single-object");
    } else if (value.length >= 5 && value[0] == 0) {
      int id = ByteBuffer.wrap(value, 1, 4).getInt();
      Schema writer = registrySchema(id);
      GenericDatumReader<GenericRecord> reader = new GenericDatumReader<>(writer, writer, model);
      BinaryDecoder body = DecoderFactory.get().binaryDecoder(value, 5, value.length - 5, null);
      record = reader.read(null, body);
      if (!body.isEnd()) {
        throw new IllegalArgumentException("bytes left after the record");
      }
      out.put("framing", "confluent");
    } else {
      throw new IllegalArgumentException("neither single-object nor Confluent-framed");
    }
    out.put("schema", record.getSchema().getFullName());
    out.set("value", tree(record));
    return out;
  }

  private Schema registrySchema(int id) throws Exception {
    Schema known = byId.get(id);
    if (known != null) {
      return known;
    }
    if (registry == null) {
      throw new IllegalArgumentException("a Confluent-framed value, and no --registry");
    }
    HttpRequest request = HttpRequest.newBuilder(URI.create(registry + "/schemas/ids/" + id)).GET().build();
    HttpResponse<String> response = http.send(request, HttpResponse.BodyHandlers.ofString());
    if (response.statusCode() != 200) {
      throw new IllegalArgumentException("the registry answers " + response.statusCode() + " for id " + id);
    }
    Schema schema = new Schema.Parser().parse(mapper.readTree(response.body()).get("schema").asText());
    byId.put(id, schema);
    return schema;
  }

  private static JsonNode tree(Object value) {
    if (value == null) {
      return JSON.nullNode();
    }
    if (value instanceof GenericRecord record) {
      ObjectNode node = JSON.objectNode();
      for (Schema.Field field : record.getSchema().getFields()) {
        node.set(field.name(), tree(record.get(field.pos())));
      }
      return node;
    }
    if (value instanceof Map<?, ?> map) {
      ObjectNode node = JSON.objectNode();
      map.forEach((k, v) -> node.set(k.toString(), tree(v)));
      return node;
    }
    if (value instanceof Collection<?> items) {
      ArrayNode node = JSON.arrayNode();
      items.forEach(item -> node.add(tree(item)));
      return node;
    }
    if (value instanceof CharSequence || value instanceof GenericData.EnumSymbol) {
      return JSON.textNode(value.toString());
    }
    if (value instanceof Boolean b) {
      return JSON.booleanNode(b);
    }
    if (value instanceof Integer i) {
      return JSON.numberNode(i);
    }
    if (value instanceof Long l) {
      return JSON.numberNode(l);
    }
    if (value instanceof Float f) {
      return JSON.numberNode(f);
    }
    if (value instanceof Double d) {
      return JSON.numberNode(d);
    }
    ObjectNode node = JSON.objectNode();
    if (value instanceof ByteBuffer buffer) {
      byte[] bytes = new byte[buffer.remaining()];
      buffer.duplicate().get(bytes);
      node.put("class", "ByteBuffer");
      node.put("hex", HexFormat.of().formatHex(bytes));
    } else if (value instanceof GenericFixed fixed) {
      node.put("class", "Fixed");
      node.put("hex", HexFormat.of().formatHex(fixed.bytes()));
    } else if (value instanceof java.math.BigDecimal decimal) {
      node.put("class", "BigDecimal");
      node.put("text", decimal.toPlainString());
    } else {
      node.put("class", value.getClass().getSimpleName());
      node.put("text", value.toString());
    }
    return node;
  }

  public static void main(String[] args) throws Exception {
    Path schemas = null;
    String registry = null;
    for (int i = 0; i + 1 < args.length; i += 2) {
      switch (args[i]) {
        case "--schemas" -> schemas = Path.of(args[i + 1]);
        case "--registry" -> registry = args[i + 1].replaceAll("/+$", "");
        default -> throw new IllegalArgumentException("unknown argument " + args[i]);
      }
    }
    if (schemas == null) {
      throw new IllegalArgumentException("usage: AvroDecode --schemas DIR [--registry URL] < hex lines");
    }
    AvroDecode decoder = new AvroDecode(schemas, registry);
    PrintStream stdout = new PrintStream(System.out, true, StandardCharsets.UTF_8);
    BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line = stdin.readLine(); line != null; line = stdin.readLine()) {
      if (line.isBlank()) {
        continue;
      }
      JsonNode result;
      try {
        result = decoder.decode(HexFormat.of().parseHex(line.strip()));
      } catch (Exception e) {
        ObjectNode error = JSON.objectNode();
        error.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
        result = error;
      }
      stdout.println(decoder.mapper.writeValueAsString(result));
    }
  }
}
