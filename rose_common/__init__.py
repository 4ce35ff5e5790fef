"""The one package every ROSE component may import; it imports none of them.

Holds what the components share: API names, the ElasticRLJob models, the generated
protobuf stubs, the Kubernetes client factory, structured logging and metric helpers.
"""
