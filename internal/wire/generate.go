package wire

// The generators are pinned as tool directives in go.mod; protoc itself comes
// from the system (Debian: protobuf-compiler).
//go:generate sh -c "protoc --plugin=protoc-gen-go=$(go tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$(go tool -n protoc-gen-go-grpc) --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative sandbox/v1/worker.proto"
