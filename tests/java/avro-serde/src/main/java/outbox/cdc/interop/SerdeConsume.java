package outbox.cdc.interop;

import io.apicurio.registry.serde.SerdeConfig;
import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import java.io.ByteArrayOutputStream;
import java.time.Duration;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import java.util.stream.Collectors;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * SerdeConsume BOOTSTRAP TOPIC REGISTRY_URL COUNT: reads COUNT records of TOPIC from the beginning
 * (read_committed) with KafkaConsumer and Apicurio's AvroKafkaDeserializer in its Confluent-compatible mode
 * (a magic byte and a 4-byte id, which the stack's registry gives as a content id), and prints a line a
 * record: partition, offset, the writer schema's full name, and the record written again with that schema
 * (Avro binary, hex): equal to what was published when the serde read every field as it was written.
 * A record it cannot read ends it with exit 1 and the serde's error.
 */
public final class SerdeConsume {
    public static void main(String[] args) throws Exception {
        if (args.length != 4) {
            System.err.println("usage: SerdeConsume BOOTSTRAP TOPIC REGISTRY_URL COUNT");
            System.exit(2);
        }
        String topic = args[1];
        int count = Integer.parseInt(args[3]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "serde-consume-" + UUID.randomUUID());
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, AvroKafkaDeserializer.class.getName());
        // The whole Java-side configuration the docs give (docs/operations.md, "Reading the topics from Java").
        props.put(SerdeConfig.REGISTRY_URL, args[2]);
        props.put(SerdeConfig.ENABLE_CONFLUENT_ID_HANDLER, "true");
        props.put(SerdeConfig.USE_ID, "contentId");
        StringBuilder out = new StringBuilder();
        int seen = 0;
        long deadline = System.nanoTime() + Duration.ofSeconds(90).toNanos();
        try (KafkaConsumer<String, GenericRecord> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions =
                    consumer.partitionsFor(topic).stream()
                            .map(p -> new TopicPartition(topic, p.partition()))
                            .collect(Collectors.toList());
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            while (seen < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, GenericRecord> record : consumer.poll(Duration.ofMillis(500))) {
                    GenericRecord value = record.value();
                    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
                    BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(bytes, null);
                    new GenericDatumWriter<GenericRecord>(value.getSchema()).write(value, encoder);
                    encoder.flush();
                    out.append(record.partition()).append('\t').append(record.offset()).append('\t')
                            .append(value.getSchema().getFullName()).append('\t')
                            .append(HexFormat.of().formatHex(bytes.toByteArray())).append('\n');
                    seen++;
                }
            }
        }
        System.out.print(out);
        if (seen < count) {
            System.err.println("read " + seen + " of " + count + " records within 90 s");
            System.exit(1);
        }
    }
}
