package outbox.cdc.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * KeyPartitions BOOTSTRAP TOPIC: reads one key a line from stdin, hex of its UTF-8 bytes (an empty line is
 * the empty key), sends each to TOPIC with the Java producer's defaults (default partitioner,
 * StringSerializer), and prints, a line per key in the same order, the partition it was acknowledged on.
 */
public final class KeyPartitions {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: KeyPartitions BOOTSTRAP TOPIC < hex keys");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        List<String> keys = new ArrayList<>();
        try (BufferedReader in =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII))) {
            String line;
            while ((line = in.readLine()) != null) {
                keys.add(new String(HexFormat.of().parseHex(line.strip()), StandardCharsets.UTF_8));
            }
        }
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (int i = 0; i < keys.size(); i++) {
                sent.add(producer.send(new ProducerRecord<>(args[1], keys.get(i), Integer.toString(i))));
            }
            producer.flush();
            StringBuilder out = new StringBuilder();
            for (Future<RecordMetadata> f : sent) {
                out.append(f.get().partition()).append('\n');
            }
            System.out.print(out);
        }
    }
}
