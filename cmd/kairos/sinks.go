package main

import (
	"time"

	"github.com/kairos-es/kairos/internal/config"
)

// sinkTypes is the one table of the sink types a configuration file may
// name: each entry gives the options its section takes, with their
// defaults. A new sink appears in the command by adding its row here.
func sinkTypes() map[string]config.SinkType {
	return map[string]config.SinkType{
		"pgtable": {Options: func() any { return &pgtableConfig{} }},
		"mysql":   {Options: func() any { return &mysqlConfig{} }},
		"webhook": {Options: func() any { return &webhookConfig{} }},
		"kafka":   {Options: func() any { return &kafkaConfig{} }},
		"bleve":   {Options: func() any { return &bleveConfig{} }},
		"nats":    {Options: func() any { return &natsConfig{} }},
		"file":    {Options: func() any { return &fileConfig{} }},
		"redis":   {Options: func() any { return &redisConfig{} }},
	}
}

// redisConfig is a Redis sink's section (sinks/redis); the URL takes
// redis:// or rediss:// (TLS), with a user and password if the server wants
// them.
type redisConfig struct {
	URL              string        `yaml:"url,required"`
	Prefix           string        `yaml:"prefix"`
	Encoding         string        `yaml:"encoding"`
	TTL              time.Duration `yaml:"ttl"`
	TombstoneTTL     time.Duration `yaml:"tombstone_ttl"`
	MaxDocumentBytes int           `yaml:"max_document_bytes"`
	ClientName       string        `yaml:"client_name"`
}

// bleveConfig is an embedded search index's section (sinks/bleve).
type bleveConfig struct {
	Dir string `yaml:"dir,required"`
	// MappingFile is a bleve index mapping as JSON; absent: dynamic.
	MappingFile      string        `yaml:"mapping_file"`
	MaxDocumentBytes int           `yaml:"max_document_bytes"`
	LockTimeout      time.Duration `yaml:"lock_timeout"`
}

// natsConfig is a JetStream key-value sink's section (sinks/nats).
type natsConfig struct {
	URL    string `yaml:"url,required"`
	Bucket string `yaml:"bucket"`
	// CredsFile is a NATS credentials file (a user JWT and its seed).
	CredsFile     string        `yaml:"creds_file"`
	Window        int           `yaml:"window"`
	AckTimeout    time.Duration `yaml:"ack_timeout"`
	Replicas      int           `yaml:"replicas"`
	MemoryStorage bool          `yaml:"memory_storage"`
}

// fileConfig is a JSON-lines file sink's section (sinks/file).
type fileConfig struct {
	Path             string `yaml:"path,required"`
	MaxDocumentBytes int    `yaml:"max_document_bytes"`
	CompactRatio     int    `yaml:"compact_ratio"`
	CompactMinLines  int    `yaml:"compact_min_lines"`
}

// kafkaConfig is a Kafka sink's section (sinks/kafka's Options), with the
// connection's TLS and SASL, which the package takes as client options.
type kafkaConfig struct {
	Brokers           []string `yaml:"brokers,required"`
	Topic             string   `yaml:"topic"`
	Create            bool     `yaml:"create"`
	Partitions        int      `yaml:"partitions"`
	ReplicationFactor int      `yaml:"replication_factor"`
	MaxMessageBytes   int      `yaml:"max_message_bytes"`
	// TLS connects with TLS, verified against the system's roots.
	TLS  bool `yaml:"tls"`
	SASL struct {
		// Mechanism is plain, scram-sha-256 or scram-sha-512; empty: no SASL.
		Mechanism string `yaml:"mechanism"`
		User      string `yaml:"user"`
		Password  string `yaml:"password"`
	} `yaml:"sasl"`
}

// pgtableConfig is a pgtable sink's section: the target database and the
// table (sinks/pgtable's Options).
type pgtableConfig struct {
	URL       string `yaml:"url,required"`
	Schema    string `yaml:"schema"`
	Table     string `yaml:"table,required"`
	KeyColumn string `yaml:"key_column"`
	SeqColumn string `yaml:"seq_column"`
	DocColumn string `yaml:"doc_column"`
	Columns   []struct {
		Name string `yaml:"name,required"`
		Path string `yaml:"path"`
		Type string `yaml:"type,required"`
	} `yaml:"columns"`
	Create bool `yaml:"create"`
}

// mysqlConfig is a MariaDB or MySQL sink's section (sinks/mysql's Options).
type mysqlConfig struct {
	DSN         string `yaml:"dsn,required"`
	Table       string `yaml:"table,required"`
	Create      bool   `yaml:"create"`
	NoJSONCheck bool   `yaml:"no_json_check"`
}

// webhookConfig is a webhook sink's section (sinks/webhook's Options).
type webhookConfig struct {
	URL           string        `yaml:"url,required"`
	Secrets       []string      `yaml:"secrets,required"`
	Timeout       time.Duration `yaml:"timeout"`
	MaxBodyBytes  int           `yaml:"max_body_bytes"`
	AllowLoopback bool          `yaml:"allow_loopback"`
	AllowPrivate  bool          `yaml:"allow_private"`
}
