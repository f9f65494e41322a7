package outbox.cdc.reference;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import org.apache.avro.Schema;
import org.apache.avro.SchemaCompatibility;
import org.apache.avro.SchemaCompatibility.SchemaCompatibilityType;

/**
 * Apache Avro's verdicts on (old, new) schema pairs, one JSON line in and one out per pair.
 *
 * <p>In: {"id": "...", "old": "<schema text>", "new": "<schema text>"}. Out: {"id": "...", "old": null or
 * why Java refuses the old schema, "new": the same for the new one, "backward": whether the new schema reads
 * data written with the old one, "forward": the other way round}. A verdict is "compatible",
 * "incompatible", or "error: ..." when the check itself throws; verdicts are null when a schema is refused.
 *
 * <p>Each schema gets a fresh {@link Schema.Parser} (names are not shared between schemas) with Avro's
 * defaults: names checked, defaults checked. The verdicts are those of
 * {@link SchemaCompatibility#checkReaderWriterCompatibility}, as a registry would compute them.
 */
public final class Verdicts {
  private static final ObjectMapper JSON = new ObjectMapper();

  private Verdicts() {}

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isBlank()) {
        continue;
      }
      JsonNode pair = JSON.readTree(line);
      ObjectNode verdict = JSON.createObjectNode();
      verdict.set("id", pair.get("id"));
      Schema old = null;
      Schema neu = null;
      try {
        old = new Schema.Parser().parse(pair.get("old").asText());
        verdict.putNull("old");
      } catch (Exception e) {
        verdict.put("old", describe(e));
      }
      try {
        neu = new Schema.Parser().parse(pair.get("new").asText());
        verdict.putNull("new");
      } catch (Exception e) {
        verdict.put("new", describe(e));
      }
      if (old != null && neu != null) {
        verdict.put("backward", compatibility(neu, old));
        verdict.put("forward", compatibility(old, neu));
      } else {
        verdict.putNull("backward");
        verdict.putNull("forward");
      }
      out.write(JSON.writeValueAsString(verdict));
      out.newLine();
    }
    out.flush();
  }

  private static String compatibility(Schema reader, Schema writer) {
    try {
      SchemaCompatibility.SchemaPairCompatibility result =
          SchemaCompatibility.checkReaderWriterCompatibility(reader, writer);
      return result.getType() == SchemaCompatibilityType.COMPATIBLE ? "compatible" : "incompatible";
    } catch (Exception e) {
      return "error: " + describe(e);
    }
  }

  private static String describe(Exception e) {
    String message = e.getClass().getSimpleName() + ": " + e.getMessage();
    return message.length() > 300 ? message.substring(0, 300) + "..." : message;
  }
}
